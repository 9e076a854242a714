#!/usr/bin/env bash
# One command for a GPU machine (NVIDIA GPUs, PyTorch 2.11 with CUDA installed
# system-wide, no internet): builds meshtrain against that PyTorch, runs the
# CUDA tests, then `meshtrain bench` (the performance model's estimate, then
# measured steps) for configs/gpt2-124m.json and
# configs/moe1b-1gpu.json (the moe1B shape cut to fit one 80 GB GPU, checked
# with `plan`), prints one table and writes summary.json plus one log per step
# into DIR, and keeps the run's small text results in the repository:
# bench/results/<date>-<device>-<commit>/ (scripts/gpu/gpu-summary.py; another
# root with --results-root), which scripts/gpu/perf-table.py renders into
# docs/gpus.md. With 2 or more GPUs the CUDA test binary also runs at -np 2 (and
# -np 8 with 8 or more) for its cases across GPUs (NCCL). Beside meshtrain's GPT-2 124M and moe1B
# it times the same models written in PyTorch (scripts/dev/cpu-bench.py
# --torch-only, the MLA + MoE one with capacity dispatch), eager and with
# torch.compile, in the same call: the anchors, with meshtrain's ratio to
# each. A failing step is reported and the next one still runs; the exit code
# is non-zero if any step failed.
# Before the build, the pre-flight (scripts/gpu/gpu-preflight.sh) checks every
# build need and names the fix of each missing one; `--preflight` runs only
# that, in seconds. Offline needs that Ubuntu images lack (PCRE2, zstd, zlib
# -dev files) come from .carry/ (scripts/gpu/gpu-carry.sh, run where apt works).
# nvcc is taken from PATH, $CUDA_HOME/bin or /usr/local/cuda/bin; a build
# without the fused CUDA kernels fails (bench would time aten composites).
# `--bin PATH` skips the build and benchmarks a binary built elsewhere
# (scripts/gpu/gpu-carry.sh --binary), its libraries found beside it and in the
# PyTorch of PYTHON; the CUDA tests run when cuda_test is beside it.
# `--time-limit S` ends every step by S seconds after the start (less
# GPU_CHECK_RESERVE, default 20 s, kept for the summary): a step still running
# then is ended with all it started ("timed out (time limit)"), the steps after
# it are "not run (time limit)", and the summary and results folder are still
# written -- for a machine lent for a fixed time. Each cuda_test run then gets at
# most a third of S. `--logs FILE` packs the step logs, steps.tsv and
# summary.json (no data, no traces) into one .tar.gz.
# Usage: scripts/gpu/gpu-check.sh DIR [--steps N] [--bin PATH] [--results-root DIR]
#                                 [--time-limit S] [--logs FILE]
#        scripts/gpu/gpu-check.sh --preflight
# Env: PYTHON (default python3), CUDA_HOME, BUILD_DIR (default build-gpu), BUILD_JOBS,
#      CUDA_TEST_TIMEOUT (seconds per cuda_test run, default 600), GPU_CHECK_RESERVE.
set -uo pipefail
# Job control: each step runs as a process group of its own, which a time
# limit ends whole (mpirun's ranks, torch.compile's workers).
set -m
START="$(date +%s)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT=""
STEPS=20
PREBUILT=""
RESULTS_ROOT="$ROOT/bench/results"
RUN_DATE="$(date +%F)"
TIME_LIMIT=""
LOGS=""
while (($#)); do
  case "$1" in
    --steps) STEPS="${2:?--steps needs a number}"; shift 2 ;;
    --bin) PREBUILT="${2:?--bin needs the path of a meshtrain binary}"; shift 2 ;;
    --preflight) exec "$ROOT/scripts/gpu/gpu-preflight.sh" ;;
    --results-root) RESULTS_ROOT="${2:?--results-root needs a folder}"; shift 2 ;;
    --time-limit) TIME_LIMIT="${2:?--time-limit needs seconds}"; shift 2
      if ! [[ "$TIME_LIMIT" =~ ^[0-9]+$ ]] || ((TIME_LIMIT <= ${GPU_CHECK_RESERVE:-20})); then
        echo "gpu-check.sh: --time-limit '$TIME_LIMIT' must be whole seconds above GPU_CHECK_RESERVE (${GPU_CHECK_RESERVE:-20})" >&2
        exit 2
      fi ;;
    --logs) LOGS="${2:?--logs needs a file name}"; shift 2 ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    -*) echo "gpu-check.sh: unknown option '$1'" >&2; exit 2 ;;
    *) [ -z "$OUT" ] || { echo "gpu-check.sh: one DIR only (got '$OUT' and '$1')" >&2; exit 2; }
       OUT="$1"; shift ;;
  esac
done
[ -n "$OUT" ] || { echo "usage: scripts/gpu/gpu-check.sh DIR [--steps N] [--bin PATH] [--results-root DIR] [--time-limit S] [--logs FILE]" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
case "$RESULTS_ROOT" in /*) ;; *) RESULTS_ROOT="$PWD/$RESULTS_ROOT" ;; esac
case "$LOGS" in /*|"") ;; *) LOGS="$PWD/$LOGS" ;; esac
PY="${PYTHON:-python3}"
BUILD="${BUILD_DIR:-$ROOT/build-gpu}"
BIN="$BUILD/meshtrain"
CUDA_TEST="$BUILD/tests/dist/cuda_test"
if [ -n "$PREBUILT" ]; then
  [ -x "$PREBUILT" ] || { echo "gpu-check.sh: --bin $PREBUILT is not an executable" >&2; exit 2; }
  BIN="$(cd "$(dirname "$PREBUILT")" && pwd)/$(basename "$PREBUILT")"
  CUDA_TEST="$(dirname "$BIN")/cuda_test"   # gpu-carry.sh --binary copies it beside
fi
# GPUs this machine shows: with 2 or more the CUDA test binary also runs at
# -np 2 (and -np 8 with 8 or more), each run a step of its own.
GPUS="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" || GPUS=0
MULTI_NP=()
((GPUS >= 2)) && MULTI_NP+=(2)
((GPUS >= 8)) && MULTI_NP+=(8)
DATA="$OUT/data"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MESHTRAIN_OFFLINE=1
cd "$ROOT" || exit 2

STEP_ROWS="$OUT/steps.tsv"   # name, status, seconds, log
: > "$STEP_ROWS"
failures=0
# Seconds the steps may still run under --time-limit (the summary's reserve
# kept back); nothing without one.
time_left() {
  [ -n "$TIME_LIMIT" ] && echo $((START + TIME_LIMIT - ${GPU_CHECK_RESERVE:-20} - $(date +%s)))
}
# step NAME CMD...: runs CMD (in a subshell, its own process group) with its
# output in DIR/NAME.log, records the outcome; under --time-limit it is not
# started without 5 s left, and ended (TERM, 10 s later KILL) when time is up.
step() {
  local name="$1" start rc left="" pid killer="" expired="$OUT/.expired_$1"
  shift
  if [ -n "$TIME_LIMIT" ]; then
    left="$(time_left)"
    if ((left < 5)); then
      failures=$((failures + 1))
      printf '%s\tnot run (time limit)\t0\t\n' "$name" >> "$STEP_ROWS"
      echo "== $name: not run (--time-limit $TIME_LIMIT spent)"
      return 1
    fi
  fi
  start=$(date +%s)
  echo "== $name${left:+ (at most ${left}s)}"
  rm -f "$expired"
  "$@" > "$OUT/$name.log" 2>&1 < /dev/null &
  pid=$!
  if [ -n "$left" ]; then
    (sleep "$left"; touch "$expired"; kill -TERM -- "-$pid"; sleep 10; kill -KILL -- "-$pid") > /dev/null 2>&1 &
    killer=$!
  fi
  # (The braces catch job control's "Terminated" notice.)
  { wait "$pid"; } 2>/dev/null
  rc=$?
  if [ -n "$killer" ]; then kill -- "-$killer" 2>/dev/null; wait "$killer" 2>/dev/null; fi
  local secs=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    printf '%s\tok\t%s\t%s\n' "$name" "$secs" "$name.log" >> "$STEP_ROWS"
    echo "   ok (${secs}s)"
  elif [ -f "$expired" ]; then
    rm -f "$expired"
    failures=$((failures + 1))
    printf '%s\ttimed out (time limit)\t%s\t%s\n' "$name" "$secs" "$name.log" >> "$STEP_ROWS"
    echo "   timed out (--time-limit $TIME_LIMIT, ${secs}s): last lines of $OUT/$name.log"
    tail -n 15 "$OUT/$name.log" | sed 's/^/   | /'
  else
    failures=$((failures + 1))
    printf '%s\tFAILED (exit %s)\t%s\t%s\n' "$name" "$rc" "$secs" "$name.log" >> "$STEP_ROWS"
    echo "   FAILED (exit $rc, ${secs}s): last lines of $OUT/$name.log"
    tail -n 15 "$OUT/$name.log" | sed 's/^/   | /'
  fi
  return "$rc"
}

environment() {
  nvidia-smi -L && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv &&
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"gpus", torch.cuda.device_count()); assert torch.cuda.is_available(), "torch sees no GPU"'
}

# nvcc as CMake should use it: PATH first, then the toolkit folders.
find_nvcc() {
  command -v nvcc && return 0
  local r
  for r in "${CUDA_HOME:-}" /usr/local/cuda; do [ -n "$r" ] && [ -x "$r/bin/nvcc" ] && { echo "$r/bin/nvcc"; return 0; }; done
  return 1
}

build() {
  local prefix nvcc
  prefix="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')" || return 1
  echo "torch cmake prefix: $prefix"
  nvcc="$(find_nvcc)" || { echo "no nvcc (PATH, CUDA_HOME, /usr/local/cuda): the fused kernels cannot be built"; return 1; }
  echo "nvcc: $nvcc"
  # Not scripts/setup.sh: it checks Debian package names, and GPU images
  # install CMake, PyTorch and friends otherwise; the pre-flight checked the
  # files the build uses.
  local args=(-DCMAKE_PREFIX_PATH="$prefix" -DMESHTRAIN_CUDA=ON -DMESHTRAIN_REQUIRE_CUDA_KERNELS=ON
              -DCMAKE_CUDA_COMPILER="$nvcc")
  if compgen -G "$ROOT/.carry/debs/*.deb" >/dev/null; then
    "$ROOT/scripts/gpu/gpu-carry.sh" --unpack || return 1
    args+=(-DMESHTRAIN_DEPS_PREFIX="$ROOT/.carry/prefix/usr")
  fi
  command -v ccache >/dev/null && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Keep going past a failing file: one run names every file that fails.
  local keep_going=(-k)
  command -v make >/dev/null || { args+=(-G Ninja); keep_going=(-k 0); }
  # Configure-time output names the NCCL found and its version.
  cmake -S "$ROOT" -B "$BUILD" "${args[@]}" &&
    cmake --build "$BUILD" -j "${BUILD_JOBS:-$(nproc)}" -- "${keep_going[@]}" || return 1
  # The fused kernels must be in: a binary without them benchmarks aten's composites.
  [ -f "$BUILD/libmt_ops_cuda.a" ] || { echo "the build has no fused CUDA kernels ($BUILD/libmt_ops_cuda.a)"; return 1; }
  grep -q '^MESHTRAIN_REQUIRE_CUDA_KERNELS:BOOL=ON' "$BUILD/CMakeCache.txt"
}

# The CUDA-only tests and the device/NCCL discovery tests. On a GPU machine a
# case skipped for want of a CUDA device is a failure (torch did not see the
# GPU); cases that run at another -np than this job's skip as everywhere.
# With several GPUs the -np 2 / 8 runs are steps of their own (cuda_test_np).
cuda_tests() {
  local own=()
  ((${#MULTI_NP[@]})) && own=(-E "^dist\.cuda_test\.np($(IFS='|'; echo "${MULTI_NP[*]}"))\$")
  ctest --test-dir "$BUILD" --output-on-failure -R 'cuda_test|unit\.device_test|unit\.nccl_discovery' "${own[@]}" ||
    return 1
  local skipped
  skipped="$("$ROOT/scripts/dev/skipped-tests.sh" "$BUILD")" || return 1
  echo "$skipped"
  if grep -q 'torch sees no CUDA device' <<<"$skipped"; then
    echo "CUDA tests were skipped on a GPU machine: torch sees no CUDA device"
    return 1
  fi
}

# The CUDA test binary under mpirun -np N as ctest runs it (tests/CMakeLists.txt:
# its mpirun flags, a scratch folder per run, a timeout): the build's, or the
# one beside --bin. A case skipped for want of a CUDA device fails here too.
cuda_test_np() {  # N
  local out rc cap="${CUDA_TEST_TIMEOUT:-600}"
  [ -n "$TIME_LIMIT" ] && [ -z "${CUDA_TEST_TIMEOUT:-}" ] && cap=$((TIME_LIMIT / 3))
  echo "$CUDA_TEST under mpirun -np $1 ($GPUS GPU(s) visible, at most ${cap}s)"
  # --foreground: in the step's process group, which a time limit ends.
  out="$(MESHTRAIN_TEST_TMP="$OUT/tmp/cuda_test.np$1" timeout --foreground "$cap" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
    --mca btl_vader_single_copy_mechanism none -np "$1" "$CUDA_TEST" 2>&1)"
  rc=$?
  printf '%s\n' "$out"
  ((rc == 0)) || return "$rc"
  if grep -q 'torch sees no CUDA device' <<<"$out"; then
    echo "CUDA tests were skipped on a GPU machine: torch sees no CUDA device"
    return 1
  fi
}

multi_gpu_tests() {
  local np
  for np in "${MULTI_NP[@]}"; do step "cuda_test_np$np" cuda_test_np "$np"; done
}

# The corpus for bench: the fortunes when installed, else the repository's
# own text (bench measures speed; any tokens will do).
corpus() {
  [ -f "$DATA/tokenizer.json" ] && return 0
  local input=/usr/share/games/fortunes i
  if [ ! -d "$input" ]; then
    input="$OUT/corpus"
    mkdir -p "$input"
    # Four copies: validation needs a full batch of GPT-2's 32 x 1024 tokens.
    for i in 1 2 3 4; do
      find "$ROOT/src" "$ROOT/include" "$ROOT/README.md" -type f -exec cat {} + > "$input/repo$i.txt"
    done
  fi
  "$BIN" prepare-data --input "$input" --output "$DATA" --vocab-size 4096 --val-fraction 0.2
}

plan_fits() {  # CONFIG
  "$BIN" plan --config "$1" --device cuda --device-memory-gb 80 &&
    "$BIN" plan --config "$1" --device cuda --device-memory-gb 80 --json | tail -n 1 > "$OUT/plan.json" &&
    "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); sys.exit(0 if p.get("fits") else 1)' "$OUT/plan.json"
}

# The performance model's estimate first (bench --device meta), then the
# measured steps: the table puts them side by side to calibrate the model.
# Three more steps run under the profiler (after the timed ones): where the
# step's device time goes, by kernel category, and the gaps between kernels;
# the Chrome trace lands in DIR/profile_NAME.
# NO_PROFILE=1 skips the profiled steps (the graph variants: time is short).
bench() {  # NAME CONFIG [--set KEY=VALUE...]
  local profile=(--profile "$OUT/profile_$1")
  [ -n "${NO_PROFILE:-}" ] && profile=()
  "$BIN" bench --config "$2" --device meta "${@:3}" || return 1
  "$BIN" bench --config "$2" --steps "$STEPS" --set device_config.device=cuda \
    --set "data_config.data_dir=$DATA" --set "output_dir=$OUT/runs" --n_device_axis 1 1 1 \
    "${profile[@]}" "${@:3}" || return 1
}

# The PyTorch anchors on the GPU: the same model, eager and compiled. moe1B's
# take at most 10 timed steps (ANCHOR_STEPS): each builds 1.1B parameters and
# compile traces 12 MoE layers, inside the GPU call's 10 minutes.
anchor() {  # CONFIG [--compile]
  "$PY" "$ROOT/scripts/dev/cpu-bench.py" --torch-only --device cuda --config "$1" \
    --steps "${ANCHOR_STEPS:-$STEPS}" --warmup 3 "${@:2}"
}

# A binary built elsewhere loads PyTorch's CUDA libraries from PYTHON's torch
# and the rest from beside itself (exported here, before the steps' subshells).
prebuilt_library_path() {
  local site
  site="$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)" || return 0
  LD_LIBRARY_PATH="$(dirname "$BIN"):$site/torch/lib:$site/nvidia/nccl/lib:$site/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
}
# Every library of the binary must resolve.
prebuilt() {
  "$PY" -c 'import torch' || return 1
  echo "binary: $BIN"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  if [ -x "$CUDA_TEST" ]; then  # its own step says whether it runs; here only what it lacks
    echo "cuda_test: $CUDA_TEST"
    ldd "$CUDA_TEST" | grep 'not found' | sed 's/^/cuda_test lacks: /'
  fi
  ldd "$BIN"
  ! ldd "$BIN" | grep 'not found'
}

# The measurements, once a binary is there; what matters most first (the
# eager anchors last), so a time limit cuts the least.
measure() {
  step corpus corpus
  step bench_gpt2-124m bench gpt2-124m configs/gpt2-124m.json
  # The same steps captured once as a CUDA graph and replayed (train/step_graph.h).
  NO_PROFILE=1 step bench_gpt2-124m-graphs bench gpt2-124m-graphs configs/gpt2-124m.json \
    --set device_config.cuda_graphs=true
  step anchor_compile_gpt2-124m anchor configs/gpt2-124m.json --compile
  step plan_moe1b-1gpu plan_fits configs/moe1b-1gpu.json
  step bench_moe1b-1gpu bench moe1b-1gpu configs/moe1b-1gpu.json
  NO_PROFILE=1 step bench_moe1b-1gpu-graphs bench moe1b-1gpu-graphs configs/moe1b-1gpu.json \
    --set device_config.cuda_graphs=true
  ANCHOR_STEPS=$(( STEPS < 10 ? STEPS : 10 ))
  step anchor_compile_moe1b-1gpu anchor configs/moe1b-1gpu.json --compile
  unset ANCHOR_STEPS
  step anchor_eager_gpt2-124m anchor configs/gpt2-124m.json
  ANCHOR_STEPS=$(( STEPS < 10 ? STEPS : 10 ))
  step anchor_eager_moe1b-1gpu anchor configs/moe1b-1gpu.json
  unset ANCHOR_STEPS
}

step preflight "$ROOT/scripts/gpu/gpu-preflight.sh"
step environment environment
if [ -n "$PREBUILT" ]; then
  prebuilt_library_path
  step prebuilt prebuilt
  if [ -x "$CUDA_TEST" ]; then
    step cuda_test_np1 cuda_test_np 1
    multi_gpu_tests
  else
    printf 'cuda_tests\tnot run (no cuda_test beside --bin)\t0\t\n' >> "$STEP_ROWS"
  fi
  measure
# A stale binary from an earlier build must not be benchmarked.
elif grep -q '^preflight	ok' "$STEP_ROWS" && step build build && [ -x "$BIN" ]; then
  step cuda_tests cuda_tests
  multi_gpu_tests
  measure
else
  grep -q '^build	' "$STEP_ROWS" || printf 'build\tnot run (preflight failed)\t0\t\n' >> "$STEP_ROWS"
  for s in cuda_tests "${MULTI_NP[@]/#/cuda_test_np}" corpus bench_gpt2-124m bench_gpt2-124m-graphs \
           anchor_eager_gpt2-124m anchor_compile_gpt2-124m plan_moe1b-1gpu bench_moe1b-1gpu bench_moe1b-1gpu-graphs \
           anchor_eager_moe1b-1gpu anchor_compile_moe1b-1gpu; do
    failures=$((failures + 1))
    printf '%s\tnot run (build failed)\t0\t\n' "$s" >> "$STEP_ROWS"
  done
fi

# One table, OUT/summary.json, and the run kept in the repository:
# RESULTS_ROOT/<date>-<device>-<commit>/ (scripts/gpu/gpu-summary.py), written
# whatever failed; scripts/gpu/perf-table.py renders the newest into docs/gpus.md.
summary_args=(--date "$RUN_DATE" --results-root "$RESULTS_ROOT")
[ -n "$PREBUILT" ] && summary_args+=(--commit-file "$(dirname "$BIN")/COMMIT")
if ! "$PY" "$ROOT/scripts/gpu/gpu-summary.py" "$OUT" "${summary_args[@]}"; then
  failures=$((failures + 1))
  echo "gpu-check: scripts/gpu/gpu-summary.py failed (the results above may be incomplete)"
fi
if [ -n "$LOGS" ]; then
  (cd "$OUT" && shopt -s nullglob && packed=(steps.tsv ./*.log) && { [ ! -f summary.json ] || packed+=(summary.json); } &&
    tar -czf "$LOGS" "${packed[@]}") ||
    { failures=$((failures + 1)); echo "gpu-check: could not pack the logs into $LOGS"; }
  echo "logs: $LOGS"
fi
if ((failures)); then
  echo "gpu-check: $failures step(s) failed (logs in $OUT)"
  exit 1
fi
echo "gpu-check: all steps passed"
