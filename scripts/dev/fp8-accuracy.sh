#!/usr/bin/env bash
# What the FP8 recipes (model_config.fp8_recipe) cost in accuracy: trains one
# config on the CPU in bf16 (seed 0), in bf16 with other seeds (the scale:
# what a seed change alone moves), and in each recipe (seed 0), same data,
# and prints one table: the train loss of each every EVERY steps, the mean
# over the last 20 steps, the mean |run - bf16| per step and the validation
# loss at the end, each run's difference from bf16 beside the seeds' spread
# (the largest minus the smallest of the bf16 runs).
# Usage: scripts/dev/fp8-accuracy.sh [CONFIG (configs/tiny.json)] [STEPS (300)] [EVERY (100)] [--set KEY=VALUE ...]
# Env: BIN (build/meshtrain), DATA (data_config.data_dir; default the
# config's), OUT (scratch dir for the runs; default a new temp dir),
# RUNS (default "bf16 bf16-seed1 bf16-seed2 bf16-seed3 tensorwise rowwise
# blockwise"; bf16-seedN is bf16 with seed N),
# TABLE_ONLY=1 (print the table of the runs already in OUT, train nothing).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONFIG="${1:-$ROOT/configs/tiny.json}"
STEPS="${2:-300}"
EVERY="${3:-100}"
shift $(($# < 3 ? $# : 3))
BIN="${BIN:-$ROOT/build/meshtrain}"
OUT="${OUT:-$(mktemp -d)}"
RUNS="${RUNS:-bf16 bf16-seed1 bf16-seed2 bf16-seed3 tensorwise rowwise blockwise}"
mkdir -p "$OUT"
extra=(--set "model_config.model_dtype=bfloat16" --set "lr.end_steps=$STEPS" --set "eval_steps=20")
[ -n "${DATA:-}" ] && extra+=(--set "data_config.data_dir=$DATA")
extra+=("$@")
for run in $RUNS; do
  [ -n "${TABLE_ONLY:-}" ] && break
  case "$run" in
    bf16) set_run=(--set "model_config.fp8_recipe=none") ;;
    bf16-seed*) set_run=(--set "model_config.fp8_recipe=none" --set "seed=${run#bf16-seed}") ;;
    *) set_run=(--set "model_config.fp8_recipe=$run") ;;
  esac
  OMP_NUM_THREADS=1 "$BIN" train --config "$CONFIG" --fresh --output_dir "$OUT" --name "$run" \
    --training_steps "$STEPS" --checkpoint_steps "$STEPS" "${extra[@]}" "${set_run[@]}" >"$OUT/$run.log" 2>&1 ||
    { echo "fp8-accuracy: the $run run failed, see $OUT/$run.log" >&2; exit 1; }
done
python3 - "$OUT" "$EVERY" $RUNS <<'PY'
import json, sys
out, every, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def rows(name):
    train, val = {}, None
    for line in open(f"{out}/{name}/metrics.jsonl"):
        r = json.loads(line)
        if "loss" in r: train[r["step"]] = r["loss"]
        if "val_loss" in r: val = r["val_loss"]
    return train, val
data = {r: rows(r) for r in runs}
base, vbase = data["bf16"]
steps = sorted(s for s in base if all(s in data[r][0] for r in runs))
print("| step | " + " | ".join(runs) + " |")
print("|---" * (len(runs) + 1) + "|")
for s in steps:
    if s % every == 0 or s == steps[-1]:
        print(f"| {s} | " + " | ".join(f"{data[r][0][s]:.4f}" for r in runs) + " |")
last = steps[-20:]
mean = {r: sum(data[r][0][s] for s in last) / len(last) for r in runs}
print(f"| mean of the last {len(last)} | " + " | ".join(f"{mean[r]:.4f}" for r in runs) + " |")
print(f"| the same, run - bf16 | " + " | ".join(f"{mean[r] - mean['bf16']:+.4f}" for r in runs) + " |")
print(f"| mean \\|run - bf16\\| per step ({len(steps)}) | " +
      " | ".join(f"{sum(abs(data[r][0][s] - base[s]) for s in steps) / len(steps):.4f}" for r in runs) + " |")
seeds = [r for r in runs if r == "bf16" or r.startswith("bf16-seed")]
spread = max(mean[r] for r in seeds) - min(mean[r] for r in seeds)
print(f"| bf16 seeds' spread, last {len(last)} | {spread:.4f} |" + " |" * (len(runs) - 1))
if all(data[r][1] is not None for r in runs):
    print(f"| validation at the end | " + " | ".join(f"{data[r][1]:.4f}" for r in runs) + " |")
    print(f"| validation, run - bf16 | " + " | ".join(f"{data[r][1] - vbase:+.4f}" for r in runs) + " |")
    vspread = max(data[r][1] for r in seeds) - min(data[r][1] for r in seeds)
    print(f"| bf16 seeds' spread, validation | {vspread:.4f} |" + " |" * (len(runs) - 1))
PY
