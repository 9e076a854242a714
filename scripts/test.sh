#!/usr/bin/env bash
# Every test: set-up, build, then ctest (unit, dist under mpirun, e2e).
# Idempotent; CI runs this through .ci/run.
#   scripts/test.sh [ctest args]          the pass/fail suite (ctest -LE bench)
#   scripts/test.sh --bench [ctest args]  only the benchmarks (ctest -L bench):
#                                         timings and pipeline bubbles, printed, not judged
set -euo pipefail
select=(-LE bench)
if [ "${1:-}" = "--bench" ]; then
  select=(-L bench)
  shift
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/build.sh"
# The Python reference libraries (tiktoken, tokenizers, ...) the parity tests
# compare against: installed once here, not inside a timed test.
"$ROOT/scripts/dev/setup-pyenv.sh" >/dev/null
export OMP_NUM_THREADS=1
# Root in containers: mpirun needs these to run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rc=0
ctest --test-dir "$BUILD" --output-on-failure -j "${TEST_JOBS:-2}" "${select[@]}" "$@" || rc=$?
# ctest counts skipped GoogleTest cases as passed: name them and their reasons.
"$ROOT/scripts/dev/skipped-tests.sh" "$BUILD"
exit "$rc"
