#!/usr/bin/env bash
# What bf16 AdamW moments (optimizer_state_dtype "bfloat16") cost in accuracy:
# trains one config twice on the CPU, fp32 then bf16 moments, same seed and
# data, and prints the train loss of both every EVERY steps, their
# difference, and the mean over the last 20 steps (and the last validation
# loss, when the runs evaluated).
# Usage: scripts/dev/moments-accuracy.sh [CONFIG (configs/tiny.json)] [STEPS (300)] [EVERY (50)] [--set KEY=VALUE ...]
# Env: BIN (build/meshtrain), DATA (data_config.data_dir; default the
# config's), OUT (scratch dir for the two runs; default a new temp dir),
# TABLE_ONLY=1 (print the table of the runs already in OUT, train nothing).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONFIG="${1:-$ROOT/configs/tiny.json}"
STEPS="${2:-300}"
EVERY="${3:-50}"
shift $(($# < 3 ? $# : 3))
BIN="${BIN:-$ROOT/build/meshtrain}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
extra=("$@")
[ -n "${DATA:-}" ] && extra+=(--set "data_config.data_dir=$DATA")
for dt in float32 bfloat16; do
  [ -n "${TABLE_ONLY:-}" ] && break
  OMP_NUM_THREADS=1 "$BIN" train --config "$CONFIG" --fresh --output_dir "$OUT" --name "$dt" \
    --training_steps "$STEPS" --checkpoint_steps "$STEPS" --set "optimizer_state_dtype=$dt" \
    --set "lr.end_steps=$STEPS" "${extra[@]}" >"$OUT/$dt.log" 2>&1 ||
    { echo "moments-accuracy: the $dt run failed, see $OUT/$dt.log" >&2; exit 1; }
done
python3 - "$OUT" "$STEPS" "$EVERY" <<'PY'
import json, sys
out, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(name):
    train, val = {}, None
    for line in open(f"{out}/{name}/metrics.jsonl"):
        r = json.loads(line)
        if "loss" in r: train[r["step"]] = r["loss"]
        if "val_loss" in r: val = r["val_loss"]
    return train, val
a, va = rows("float32")
b, vb = rows("bfloat16")
print("| step | loss, fp32 moments | loss, bf16 moments | bf16 - fp32 |")
print("|---|---|---|---|")
shown = sorted(s for s in a if s in b and (s % every == 0 or s == max(a)))
for s in shown:
    print(f"| {s} | {a[s]:.4f} | {b[s]:.4f} | {b[s] - a[s]:+.4f} |")
last = sorted(s for s in a if s in b)[-20:]
ma, mb = sum(a[s] for s in last) / len(last), sum(b[s] for s in last) / len(last)
print(f"| mean of the last {len(last)} | {ma:.4f} | {mb:.4f} | {mb - ma:+.4f} |")
both = [s for s in a if s in b]
print(f"| mean of \\|bf16 - fp32\\| over all {len(both)} steps | | | {sum(abs(b[s] - a[s]) for s in both) / len(both):.4f} |")
if va is not None and vb is not None:
    print(f"| validation at the end | {va:.4f} | {vb:.4f} | {vb - va:+.4f} |")
PY
