# Shared by the e2e scripts: argument handling, a tiny prepared corpus, checks
# that count, and the closing "N passed, N failed" line.
# Usage in a script: source "$(dirname "$0")/common.sh" "$@"
set -uo pipefail
BIN="${1:?usage: <script> BINARY SRC_DIR WORK_DIR}"
SRC="${2:?usage: <script> BINARY SRC_DIR WORK_DIR}"
WORK="${3:?usage: <script> BINARY SRC_DIR WORK_DIR}"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca btl_vader_single_copy_mechanism none)

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   - $1"; }
bad() { failed=$((failed + 1)); echo "FAIL - $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | tail -20 | sed 's/^/       | /'; }
check() { local name="$1"; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

# A small slice of the fortunes corpus, prepared once per script (~2 s).
prepare_corpus() {
  mkdir -p corpus
  for f in computers cookie definitions; do cp "/usr/share/games/fortunes/$f" corpus/; done
  "$BIN" prepare-data --input corpus --output data --vocab-size 320 > prepare.log 2>&1
}

# tiny config with the corpus above: CONFIG file name; extra --set via TINY_SETS.
write_config() {
  python3 - "$SRC/configs/tiny.json" "$1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["data_config"]["data_dir"] = "data"
c["model_config"]["vocab_size"] = 320
c["output_dir"] = "runs"
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
}

# The losses (or another key) of metrics.jsonl training rows, one per line.
metric() { python3 -c "
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l)
    if sys.argv[2] in r: print(r[sys.argv[2]])" "$1" "$2"; }
