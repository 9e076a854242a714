#!/usr/bin/env bash
# Training time a checkpoint save costs, synchronous vs async_checkpoint, on
# a model large enough for the write to matter on a CPU: a 12-layer d=768
# dense model (85.2 M parameters; weights + AdamW moments = 1.0 GB per save),
# batch 1 x 64 tokens so the steps stay short. Trains 9 steps with a save
# every 4 in each mode and prints checkpoint_blocked_seconds of the saves at
# steps 4 and 8 (the final save at step 9 waits for its write in both modes,
# as every save at the end of training does).
# Usage: scripts/dev/ckpt-blocked.sh [BINARY] [WORK_DIR]   (about 3 minutes on 2 cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$(realpath "${1:-$ROOT/build/meshtrain}")"
WORK="${2:-$ROOT/build/ckpt-blocked}"
rm -rf "$WORK"
mkdir -p "$WORK/corpus"
cd "$WORK"
export OMP_NUM_THREADS=1
for f in computers cookie definitions; do cp "/usr/share/games/fortunes/$f" corpus/; done
"$BIN" prepare-data --input corpus --output data --vocab-size 320 > prepare.log 2>&1
python3 - "$ROOT/configs/tiny.json" big.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["model_config"].update(model_dimension=768, n_head=12, blocks=12, layers_per_block=1, vocab_size=320, T=64)
c["data_config"].update(data_dir="data", T=64, train_batch_size=1, val_batch_size=1, micro_batch_size=1)
c.update(output_dir="runs", training_steps=9, checkpoint_steps=4, eval_steps=0, max_to_keep=2)
c["inference_config"]["max_tokens"] = 0
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
for mode in false true; do
  "$BIN" train --config big.json --name "async_$mode" --set async_checkpoint=$mode --fresh > "train_$mode.log" 2>&1
  python3 - "runs/async_$mode/metrics.jsonl" "$mode" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "loss" in r]
step_s = sorted(64 / r["tokens_per_sec"] for r in steps if r["tokens_per_sec"] > 0)
lost = {}
for r in rows:
    if "checkpoint_blocked_seconds" in r:
        # a commit row belongs to the save in flight before it
        key = r["step"] if not r.get("checkpoint_committed") else max(k for k in lost if k <= r["step"])
        lost[key] = lost.get(key, 0) + r["checkpoint_blocked_seconds"]
mode = "async_checkpoint" if sys.argv[2] == "true" else "synchronous"
print(f"{mode:17s} median step {step_s[len(step_s) // 2]:.2f} s; blocked per save: " +
      ", ".join(f"step {k}: {v:.3f} s" for k, v in sorted(lost.items())))
PY
done
