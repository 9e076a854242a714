#!/usr/bin/env bash
# Lists the GoogleTest cases the last ctest run skipped, each with its reason.
# ctest counts a test binary whose cases called GTEST_SKIP as passed, so
# without this a skip (e.g. a CUDA test on a machine without a GPU) would be
# visible only inside Testing/Temporary/LastTest.log.
# Usage: scripts/dev/skipped-tests.sh BUILD_DIR
set -euo pipefail
log="${1:?usage: scripts/dev/skipped-tests.sh BUILD_DIR}/Testing/Temporary/LastTest.log"
[ -f "$log" ] || { echo "skipped-tests: no ctest log at $log" >&2; exit 1; }
# gtest prints "FILE:LINE: Skipped", the reason, then "[  SKIPPED ] Suite.Case (N ms)";
# ranks of a multi-rank test print the same lines, hence sort -u.
rows=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
  / Skipped$/ { grab = 1; reason = ""; next }
  grab && /^\[  SKIPPED \] [A-Za-z_].* \([0-9]+ ms\)$/ {
    name = $0; sub(/^\[  SKIPPED \] /, "", name); sub(/ \([0-9]+ ms\)$/, "", name)
    print "  " name ": " (reason == "" ? "(no reason given)" : reason); grab = 0; next }
  grab && NF { reason = reason (reason == "" ? "" : " ") $0 }' | sort -u)
if [ -n "$rows" ]; then
  echo "skipped test cases ($(wc -l <<<"$rows")), with their reasons:"
  echo "$rows"
fi
# Whole scripts that skipped (exit 77, ctest's "Skipped"), e.g. the multi-host
# tests where network namespaces cannot be made: they print "SKIP: reason".
skips=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^SKIP: ' | sort -u || true)
if [ -n "$skips" ]; then
  echo "skipped test scripts ($(wc -l <<<"$skips")), with their reasons:"
  echo "${skips//SKIP: /  }"
fi
