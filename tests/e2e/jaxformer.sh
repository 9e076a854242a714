#!/usr/bin/env bash
# Jaxformer's architecture as a user runs it: the tiny config in Jaxformer's
# layout trains on 1 and on 2 x 1 x 2 ranks, reports expert loads for its one
# MoE layer per block, samples, and `checkpoint inspect` gives the same total
# and active counts as `plan`.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
python3 - "$SRC/configs/tiny-jaxformer.json" jax.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["data_config"]["data_dir"] = "data"
c["model_config"]["vocab_size"] = 320
c["output_dir"] = "runs"
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
# JSON field of the last line of $1 that parses as an object.
field() { python3 -c "
import json,sys
rows=[json.loads(l) for l in sys.argv[1].splitlines() if l.startswith('{')]
print(rows[-1][sys.argv[2]])" "$1" "$2"; }

json=$("$BIN" plan --config jax.json --json 2>&1)
total=$(field "$json" total_params)
active=$(field "$json" active_params)
echo "       # tiny-jaxformer: total $total, active $active"
check "plan: formula = built model" test "$(field "$json" formula_checked)" = True

out=$("$BIN" train --config jax.json --training_steps 6 --checkpoint_steps 3 --set lr.warmup_steps=2 \
      --set lr.end_steps=6 --fresh 2>&1)
check "tiny Jaxformer trains (exit 0)" test $? -eq 0 || echo "$out" | tail -20
check "expert loads for the 2 MoE layers (one per block)" python3 -c "
import json
rows=[json.loads(l) for l in open('runs/tiny-jaxformer/metrics.jsonl') if '\"expert_load\"' in l]
assert len(rows[-1]['expert_load']) == 2 and all(len(l) == 4 for l in rows[-1]['expert_load']), rows[-1]
"
ckpt=$(ls -d runs/tiny-jaxformer/checkpoints/step_* | tail -1)
out=$("$BIN" checkpoint inspect "$ckpt" 2>&1)
check "checkpoint inspect: plan's total and active counts" grep -q "parameters: $total total, $active active per token" <<<"$out"
check "checkpoint inspect: biases and the shared projection saved" grep -q "layers.1.moe.shared_proj.bias" <<<"$out"
out=$("$BIN" generate --config jax.json --prompt "The" --max_tokens 8 2>&1)
check "tiny Jaxformer samples with the latent cache" test $? -eq 0

out=$("${MPIRUN[@]}" -np 4 "$BIN" train --config jax.json --n_device_axis 2 1 2 --name jax-dp2tp2 \
      --training_steps 3 --set lr.warmup_steps=1 --set sequence_parallel=true --fresh 2>&1)
check "tiny Jaxformer trains on dp 2 x tp 2 with sequence parallelism" test $? -eq 0 || echo "$out" | tail -20
finish
