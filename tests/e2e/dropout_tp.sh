#!/usr/bin/env bash
# Dropout on a tensor-parallel mesh (tp = 2, with and without sequence
# parallelism): runs are reproducible, the masks matter, and a resumed run
# continues the same masks: 3 steps + 3 resumed give the losses of 6
# straight, bit for bit (the per-tp-rank dropout streams derive from the
# checkpointed generator state, model/dropout_rng.h).
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set model_config.dropout_rate=0.2 --eval_steps 1
   --set inference_config.max_tokens=0 --n_device_axis 1 1 2)
# Steps 1..6's losses of run $1 (the last row of each step: a resumed run
# appends to the first invocation's file).
losses() { python3 -c "
import json,sys
last={}
for l in open(sys.argv[1]):
    r=json.loads(l)
    if 'loss' in r and 'step' in r: last[r['step']]=r['loss']
print(' '.join(repr(last.get(s)) for s in range(1,7)))" "runs/$1/metrics.jsonl"; }
complete() { [[ "$1" != *None* ]]; }

for sp in false true; do
  S=(--set "sequence_parallel=$sp")
  "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" "${S[@]}" --name "straight-$sp" --training_steps 6 --fresh \
    > "straight-$sp.log" 2>&1 || bad "tp 2 sp=$sp: straight run" "$(cat "straight-$sp.log")"
  check "tp 2 sp=$sp: the straight run logged 6 losses" complete "$(losses "straight-$sp")"
  "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" "${S[@]}" --name "again-$sp" --training_steps 6 --fresh \
    > "again-$sp.log" 2>&1
  check "tp 2 sp=$sp: a second run draws the same masks" test "$(losses "again-$sp")" = "$(losses "straight-$sp")"
  "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" "${S[@]}" --set model_config.dropout_rate=0 --name "nodrop-$sp" \
    --training_steps 6 --fresh > "nodrop-$sp.log" 2>&1
  check "tp 2 sp=$sp: dropout changes the losses" test "$(losses "nodrop-$sp")" != "$(losses "straight-$sp")"
  "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" "${S[@]}" --name "resumed-$sp" --training_steps 3 --checkpoint_steps 3 \
    --fresh > "r1-$sp.log" 2>&1
  "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" "${S[@]}" --name "resumed-$sp" --training_steps 6 --checkpoint_steps 3 \
    > "r2-$sp.log" 2>&1
  check "tp 2 sp=$sp: resume logs it resumed" grep -q "resumed from .*step_00000003" "r2-$sp.log"
  check "tp 2 sp=$sp: 3 + 3 resumed steps give the losses of 6 straight, bit for bit" \
    test "$(losses "resumed-$sp")" = "$(losses "straight-$sp")"
done
finish
