#!/usr/bin/env bash
# Expert parallelism as a user runs it: the tiny MoE on 2 ranks with
# device_config.expert_parallel 2 (dropless), the checkpoint shows its experts
# split, it resumes on expert_parallel 1, plan counts the experts per rank,
# bench reports the all-to-all share, and a bad expert_parallel names the key.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
python3 - "$SRC/configs/tiny-moe-mla.json" moe.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["data_config"]["data_dir"] = "data"
c["model_config"]["vocab_size"] = 320
c["model_config"]["capacity_factor"] = 0
c["device_config"] = {"n_device_axis": [2, 1, 1], "expert_parallel": 2}
c["output_dir"] = "runs"
c["eval_steps"] = 1
c["inference_config"]["max_tokens"] = 4
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
out=$(timeout 300 "${MPIRUN[@]}" -np 2 "$BIN" train --config moe.json --training_steps 6 --checkpoint_steps 3 --fresh 2>&1)
check "trains on dp 2 with expert_parallel 2 (exit 0)" test $? -eq 0 || printf '%s\n' "$out" | tail -20
check "MaxVio per MoE layer in metrics.jsonl" python3 -c "
import json
r=[json.loads(l) for l in open('runs/tiny-moe-mla/metrics.jsonl') if '\"loss\"' in l][-1]
assert r['dropped_fraction'] == 0, r['dropped_fraction']
assert len(r['max_vio']) == len(r['expert_load']) == 4, r
for v, load in zip(r['max_vio'], r['expert_load']):
    assert abs(v - (max(load) * len(load) - 1)) < 1e-9, (v, load)
"
out=$("$BIN" checkpoint inspect runs/tiny-moe-mla/checkpoints/step_00000006 2>&1)
check "checkpoint inspect shows the experts split over expert_parallel" \
  grep -q "model.layers.0.moe.experts.w_in  \[4, 64, 64\]  F32  experts (dim 0) in 2" <<<"$out"
out=$("$BIN" train --config moe.json --n_device_axis 1 1 1 --set device_config.expert_parallel=1 \
      --training_steps 8 2>&1)
check "resumes on one process (expert_parallel 1)" test $? -eq 0
check "... from step 6" grep -q "step_00000006" <<<"$out"
out=$("$BIN" plan --config moe.json 2>&1)
check "plan counts the experts per rank" grep -q "65536 routed-expert params per rank, 1/2" <<<"$out"
out=$(timeout 300 "${MPIRUN[@]}" -np 2 "$BIN" bench --config moe.json --steps 2 2>&1)
check "bench reports the all-to-all share" grep -q "all-to-all .* % of the step time (expert_parallel 2" <<<"$out"
out=$("$BIN" plan --config moe.json --set device_config.expert_parallel=3 2>&1)
check "a bad expert_parallel names the key" grep -q "device_config.expert_parallel (3) must divide dp = 2" <<<"$out"
finish
