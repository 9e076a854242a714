#!/usr/bin/env bash
# The Jaxformer model on the corpus: MoE + MLA trains, reports its router
# metrics, keeps the aux loss bounded and starves no expert; plus the moe1b
# parameter counts.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
python3 - "$SRC/configs/tiny-moe-mla.json" moe.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["data_config"]["data_dir"] = "data"
c["model_config"]["vocab_size"] = 320
c["output_dir"] = "runs"
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
out=$("$BIN" train --config moe.json --training_steps 40 --checkpoint_steps 20 --set lr.warmup_steps=5 \
      --set lr.end_steps=40 --fresh 2>&1)
check "MoE + MLA trains (exit 0)" test $? -eq 0
check "total and active parameters printed" grep -qE "parameters: [0-9.]+M total, [0-9.]+M active" <<<"$out"
check "MoE metrics in metrics.jsonl" python3 -c "
import json
rows=[json.loads(l) for l in open('runs/tiny-moe-mla/metrics.jsonl') if '\"loss\"' in l]
r=rows[-1]
assert all(k in r for k in ('aux_loss','loss_cross','dropped_fraction','expert_load')), r.keys()
assert len(r['expert_load']) == 4 and all(len(l) == 4 for l in r['expert_load'])
"
check "loss falls" python3 -c "
import json
v=[json.loads(l)['loss'] for l in open('runs/tiny-moe-mla/metrics.jsonl') if '\"loss\"' in l]
assert sum(v[-5:])/5 < v[0] - 0.5, (v[0], v[-5:])
"
# Balanced routing gives aux = number of MoE layers (E * sum f_i P_i = 1 per
# layer); collapse onto one expert gives E per layer.
check "aux loss stays bounded (< 1.5 per layer)" python3 -c "
import json
rows=[json.loads(l) for l in open('runs/tiny-moe-mla/metrics.jsonl') if '\"aux_loss\"' in l]
layers=len(rows[-1]['expert_load'])
assert max(r['aux_loss'] for r in rows) < 1.5 * layers, max(r['aux_loss'] for r in rows)
"
check "no expert starved over the last 10 steps" python3 -c "
import json
rows=[json.loads(l) for l in open('runs/tiny-moe-mla/metrics.jsonl') if '\"expert_load\"' in l][-10:]
for layer in range(len(rows[-1]['expert_load'])):
    for e in range(len(rows[-1]['expert_load'][layer])):
        assert sum(r['expert_load'][layer][e] for r in rows) > 0, (layer, e)
"
out=$("$BIN" generate --config moe.json --prompt "The" --max_tokens 10 2>&1)
check "MoE + MLA samples with the latent cache" test $? -eq 0
out=$("$BIN" plan --config "$SRC/configs/moe1b.json" --device cuda 2>&1)
check "moe1b: 4.22B total, 1.05B active parameters" grep -qE "4,218,241,536|4218241536" <<<"$out"
finish
