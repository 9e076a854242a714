#!/usr/bin/env bash
# FP8 recipes (model_config.fp8_recipe) as a user runs them: each trains on
# CPU ranks with its recipe in the start-up log and `plan`, a recipe without
# bf16 and a mesh that would cut a blockwise tile are refused naming the
# keys, a run resumes with another recipe (warned), a tp 2 mesh with
# sequence parallelism trains, and a checkpoint exports to Hugging Face as a
# bf16 run's does (FP8 changes the GEMMs, not the parameters).
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set model_config.model_dtype=bfloat16 --set lr.end_steps=20 --checkpoint_steps 4
   --eval_steps 1 --set inference_config.max_tokens=0)

for recipe in tensorwise rowwise blockwise; do
  "$BIN" train "${T[@]}" --set model_config.fp8_recipe=$recipe --name $recipe --training_steps 4 --fresh \
    > $recipe.log 2>&1
  check "$recipe: trains 4 steps on CPU" test "$(metric runs/$recipe/metrics.jsonl loss | wc -l)" -eq 4
  check "$recipe: the start-up log names the recipe" grep -q "precision: .*FP8 $recipe" $recipe.log
  check "$recipe: the losses are finite" python3 -c "
import math, sys
sys.exit(0 if all(math.isfinite(float(x)) for x in sys.argv[1:]) else 1)" $(metric runs/$recipe/metrics.jsonl loss)
done
"$BIN" train "${T[@]}" --name bf16 --training_steps 4 --fresh > bf16.log 2>&1
check "FP8 is in use: tensorwise's losses are not bf16's" \
  test "$(metric runs/tensorwise/metrics.jsonl loss | tail -1)" != "$(metric runs/bf16/metrics.jsonl loss | tail -1)"
check "bf16 alone: no FP8 in the start-up log" bash -c "! grep -q FP8 bf16.log"

out=$("$BIN" plan --config tiny.json --set model_config.model_dtype=bfloat16 --set model_config.fp8_recipe=rowwise 2>&1)
check "plan names the recipe" grep -q "precision: .*FP8 rowwise" <<<"$out"

out=$("$BIN" train --config tiny.json --set model_config.fp8_recipe=tensorwise --name refused --fresh 2>&1)
check "a recipe on float32 is refused" test $? -ne 0
check "... naming fp8_recipe and model_dtype" bash -c 'grep -q "model_config.fp8_recipe" <<<"$1" &&
                                                     grep -q "model_config.model_dtype" <<<"$1"' _ "$out"
out=$("$BIN" plan "${T[@]:0:4}" --set model_config.fp8_recipe=blockwise --n_device_axis 1 1 2 2>&1)
check "blockwise over tp cutting a 128-wide tile is refused" test $? -ne 0
check "... naming the keys" bash -c 'grep -q "model_config.fp8_recipe \"blockwise\"" <<<"$1" &&
                                     grep -q "device_config.n_device_axis" <<<"$1"' _ "$out"

# A bf16 run resumes with a recipe: the parameters and optimizer state are
# the same fp32 tensors; the resume says what changed.
"$BIN" train "${T[@]}" --name bf16 --training_steps 8 --set model_config.fp8_recipe=blockwise > switch.log 2>&1
check "a bf16 checkpoint resumes under blockwise" grep -q "resumed from .*step_00000004" switch.log
check "... warning about model_config.fp8_recipe" grep -q "model_config.fp8_recipe" switch.log
check "... and trains on to step 8" test "$(metric runs/bf16/metrics.jsonl loss | wc -l)" -eq 8

# tp 2 with sequence parallelism, tensorwise (amax reduced over tp).
"${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --set model_config.fp8_recipe=tensorwise --name tp --training_steps 4 \
  --n_device_axis 1 1 2 --set sequence_parallel=true --fresh > tp.log 2>&1
check "tp 2 + sequence parallelism trains under tensorwise" test "$(metric runs/tp/metrics.jsonl loss | wc -l)" -eq 4
check "... within 2^-5 of one FP8 process's losses" python3 -c "
import sys
a = [float(x) for x in sys.argv[1:5]]; b = [float(x) for x in sys.argv[5:9]]
sys.exit(0 if all(abs(x - y) <= 2 ** -5 * abs(y) for x, y in zip(a, b)) else 1)" \
  $(metric runs/tp/metrics.jsonl loss) $(metric runs/tensorwise/metrics.jsonl loss)

# Export: the checkpoint of an FP8 run is a bf16 run's (fp32 master weights).
"$BIN" checkpoint export runs/tensorwise/checkpoints/step_00000004 --format hf --output hf-tensorwise > export.log 2>&1
check "an FP8 run's checkpoint exports to Hugging Face" test -f hf-tensorwise/config.json
finish
