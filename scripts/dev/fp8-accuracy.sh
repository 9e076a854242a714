#!/usr/bin/env bash
# What the FP8 recipes (model_config.fp8_recipe) cost in accuracy: trains one
# config on the CPU in bf16 and in each recipe, each with several seeds (the
# scale: what a seed change alone moves), same data, and prints two tables:
# the train loss of the seed-0 runs every EVERY steps (with the mean over the
# last 20 steps, the mean |run - bf16| per step and the validation loss at the
# end), and every run's validation loss at the end by seed, with each
# recipe's mean against bf16's and the spread of bf16's seeds (largest minus
# smallest).
# Usage: scripts/dev/fp8-accuracy.sh [CONFIG (configs/tiny.json)] [STEPS (300)] [EVERY (50)] [--set KEY=VALUE ...]
# Env: BIN (build/meshtrain), DATA (data_config.data_dir; default the
# config's), OUT (scratch dir for the runs; default a new temp dir), RECIPES
# (default "bf16 tensorwise rowwise blockwise"; bf16 is fp8_recipe none),
# SEEDS (default "0 1 2 3"), TABLE_ONLY=1 (print the tables of the runs in
# OUT, train nothing). A run whose metrics already end with a validation
# loss in OUT is not trained again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONFIG="${1:-$ROOT/configs/tiny.json}"
STEPS="${2:-300}"
EVERY="${3:-50}"
shift $(($# < 3 ? $# : 3))
BIN="${BIN:-$ROOT/build/meshtrain}"
OUT="${OUT:-$(mktemp -d)}"
RECIPES="${RECIPES:-bf16 tensorwise rowwise blockwise}"
SEEDS="${SEEDS:-0 1 2 3}"
mkdir -p "$OUT"
extra=(--set "model_config.model_dtype=bfloat16" --set "lr.end_steps=$STEPS" --set "eval_steps=20")
[ -n "${DATA:-}" ] && extra+=(--set "data_config.data_dir=$DATA")
extra+=("$@")
for seed in $SEEDS; do
  for recipe in $RECIPES; do
    [ -n "${TABLE_ONLY:-}" ] && break 2
    run="$recipe-seed$seed"
    grep -q '"val_loss"' "$OUT/$run/metrics.jsonl" 2>/dev/null && continue
    fp8="$recipe"
    [ "$recipe" = bf16 ] && fp8=none
    OMP_NUM_THREADS=1 "$BIN" train --config "$CONFIG" --fresh --output_dir "$OUT" --name "$run" \
      --training_steps "$STEPS" --checkpoint_steps "$STEPS" "${extra[@]}" --set "model_config.fp8_recipe=$fp8" \
      --set "seed=$seed" >"$OUT/$run.log" 2>&1 ||
      { echo "fp8-accuracy: the $run run failed, see $OUT/$run.log" >&2; exit 1; }
  done
done
python3 - "$OUT" "$EVERY" "$RECIPES" "$SEEDS" <<'PY'
import json, os, sys
out, every = sys.argv[1], int(sys.argv[2])
recipes, seeds = sys.argv[3].split(), sys.argv[4].split()
def rows(name):
    train, val = {}, None
    path = f"{out}/{name}/metrics.jsonl"
    if not os.path.exists(path): return None
    for line in open(path):
        r = json.loads(line)
        if "loss" in r: train[r["step"]] = r["loss"]
        if "val_loss" in r: val = r["val_loss"]
    return train, val
data = {(r, s): rows(f"{r}-seed{s}") for r in recipes for s in seeds}
first = seeds[0]
runs = [r for r in recipes if data[(r, first)]]
base = data[("bf16", first)][0]
steps = sorted(s for s in base if all(s in data[(r, first)][0] for r in runs))
print(f"Train loss, seed {first}:\n")
print("| step | " + " | ".join(runs) + " |")
print("|---" * (len(runs) + 1) + "|")
for s in steps:
    if s % every == 0 or s == steps[-1]:
        print(f"| {s} | " + " | ".join(f"{data[(r, first)][0][s]:.4f}" for r in runs) + " |")
last = steps[-20:]
mean = {r: sum(data[(r, first)][0][s] for s in last) / len(last) for r in runs}
print(f"| mean of the last {len(last)} | " + " | ".join(f"{mean[r]:.4f}" for r in runs) + " |")
print(f"| mean \\|run - bf16\\| per step | " +
      " | ".join(f"{sum(abs(data[(r, first)][0][s] - base[s]) for s in steps) / len(steps):.4f}" for r in runs) + " |")
print(f"| validation at the end | " + " | ".join(f"{data[(r, first)][1]:.4f}" for r in runs) + " |")
print("\nValidation loss at the end, by seed:\n")
print("| run | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | mean - bf16's |")
print("|---" * (len(seeds) + 3) + "|")
vals = {r: [data[(r, s)][1] for s in seeds if data[(r, s)] and data[(r, s)][1] is not None] for r in recipes}
vmean = {r: sum(v) / len(v) for r, v in vals.items() if v}
for r in recipes:
    if not vals[r]: continue
    cells = [f"{data[(r, s)][1]:.4f}" if data[(r, s)] and data[(r, s)][1] is not None else "" for s in seeds]
    print(f"| {r} | " + " | ".join(cells) + f" | {vmean[r]:.4f} | {vmean[r] - vmean['bf16']:+.4f} |")
b = vals["bf16"]
print(f"\nbf16's seeds: spread (largest - smallest) {max(b) - min(b):.4f}, range [{min(b):.4f}, {max(b):.4f}]")
PY
