#!/usr/bin/env bash
# Hugging Face in and out, against stock transformers (fp32, CPU):
#  - a dense GELU model, a SwiGLU + GQA model and an MLA + MoE model with the
#    DeepSeek-V3 options (also with 2 multi-token prediction layers, which
#    round-trip exactly) train a few steps, export with --format hf, and load in
#    LlamaForCausalLM / DeepseekV3ForCausalLM with the same val loss (1e-5
#    relative) and the same greedy text;
#  - models without a stock equivalent are refused with what does not map;
#  - random Llama (GQA, 1 kv head) and DeepSeek-V3 models saved by transformers
#    import (--init-from-hf), export back identical, and train on a (2,2,2)
#    mesh with the losses of one process.
source "$(dirname "$0")/common.sh" "$@"

PY=$("$SRC/scripts/dev/setup-pyenv.sh" | tail -1)
if [ ! -x "$PY" ]; then bad "the Python venv of scripts/dev/setup-pyenv.sh is missing ($PY)"; finish; fi
CHECK="$SRC/tests/e2e/hf_check.py"

prepare_corpus
write_config base.json
python3 - <<'PY'
import json
c = json.load(open("base.json"))
c["training_steps"] = 6
c["checkpoint_steps"] = 6
c["lr"].update(warmup_steps=2, end_steps=6)
c["eval_steps"] = 2
json.dump(c, open("base.json", "w"), indent=1)
PY

GELU=()
LLAMA=(--set model_config.mlp_activation=swiglu --set model_config.n_kv_head=2 --set model_config.tie_embeddings=false)
V3=(--set model_config.attention=mla --set model_config.latent_dim=16 --set model_config.dhR=8
    --set model_config.ffn=moe --set model_config.n_experts=4 --set model_config.k=2 --set model_config.n_shared=1
    --set model_config.mlp_hidden=32 --set model_config.mlp_activation=swiglu --set model_config.mla_latent_norm=true
    --set model_config.router_score=sigmoid --set model_config.router_bias=true
    --set model_config.router_bias_update_rate=0.01
    --set model_config.routed_scaling_factor=2.5 --set model_config.n_group=2 --set model_config.topk_group=1
    --set model_config.first_k_dense=1 --set model_config.dense_mlp_hidden=48 --set alpha=0.01)

export_and_compare() {  # NAME CLASS SETS...
  local name="$1" cls="$2" out rc
  shift 2
  out=$("$BIN" train --config base.json --name "$name" --fresh "$@" 2>&1)
  rc=$?
  check "$name: trains" test $rc -eq 0
  [ $rc -eq 0 ] || { bad "$name train output" "$out"; return; }
  local val gen
  # The step-6 evaluation at full precision (what `meshtrain eval` prints rounded).
  val=$(metric "runs/$name/metrics.jsonl" val_loss | tail -1)
  out=$("$BIN" eval --config base.json --name "$name" "$@" 2>/dev/null | sed -n 's/^val_loss //p')
  check "$name: meshtrain eval agrees ($out)" python3 -c "import sys; sys.exit(0 if abs($out - $val) < 1e-4 else 1)"
  # All 12 tokens, as hf_check.py's greedy loop: no stop at end-of-text.
  "$BIN" generate --config base.json --name "$name" "$@" --prompt "The computer" --max_tokens 12 --temperature 0 \
    --set inference_config.stop_at_eot=false 2>/dev/null > "gen_$name.txt"
  out=$("$BIN" checkpoint export "runs/$name/checkpoints/step_00000006" --format hf --output "hf_$name" 2>&1)
  check "$name: export --format hf" test $? -eq 0 -a -f "hf_$name/config.json" -a -f "hf_$name/tokenizer.json" \
    -a -f "hf_$name/generation_config.json" -a -f "hf_$name/model.safetensors"
  out=$("$PY" "$CHECK" compare "hf_$name" "$cls" data/val 16 2 32 "$val" "The computer" 12 "gen_$name.txt" 2>&1)
  check "$name: $cls in transformers gives meshtrain's val loss and greedy text" test $? -eq 0
  printf '%s\n' "$out" | grep -v Warning | sed 's/^/       /'
}

export_and_compare gelu LlamaForCausalLM "${GELU[@]}"
export_and_compare llama LlamaForCausalLM "${LLAMA[@]}"
export_and_compare v3 DeepseekV3ForCausalLM "${V3[@]}"
# DeepSeek-V3's multi-token prediction layers (layers n_layers.., num_nextn_predict_layers):
# stock transformers loads the export and ignores them; import reads them back exactly.
export_and_compare v3mtp DeepseekV3ForCausalLM "${V3[@]}" --set model_config.mtp_depth=2
check "v3mtp: config.json has num_nextn_predict_layers 2" grep -q '"num_nextn_predict_layers": 2' hf_v3mtp/config.json
out=$("$BIN" train --config base.json --name rt_v3mtp --fresh --init-from-hf hf_v3mtp --training_steps 1 \
      --set lr.max_lr=0 --set lr.end_lr=0 2>&1)
check "v3mtp: --init-from-hf reads the MTP layers" test $? -eq 0
"$BIN" checkpoint export runs/rt_v3mtp/checkpoints/step_00000001 --format hf --output rt_v3mtp >/dev/null 2>&1
out=$("$PY" "$CHECK" same hf_v3mtp rt_v3mtp 2>&1)
check "v3mtp: HF -> meshtrain -> HF gives identical tensors, MTP layers included" test $? -eq 0

# Sharded like save_pretrained above the size limit.
out=$("$BIN" checkpoint export runs/v3/checkpoints/step_00000006 --format hf --output hf_v3_sharded \
      --max-shard-size 100KB 2>&1)
check "export shards above --max-shard-size with an index" test $? -eq 0 -a -f hf_v3_sharded/model.safetensors.index.json \
  -a -f hf_v3_sharded/model-00001-of-0000$(ls hf_v3_sharded | grep -c '^model-0').safetensors
out=$("$PY" "$CHECK" same hf_v3 hf_v3_sharded 2>&1)
check "the shards hold the same tensors" test $? -eq 0

expect_error() {  # NAME PATTERN CMD...
  local name="$1" pat="$2" out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] && grep -q -- "$pat" <<<"$out"; then ok "$name"; else bad "$name (rc $rc)" "$out"; fi
}
# No stock equivalent: refused with the reasons, nothing written.
"$BIN" train --config base.json --name moemha --fresh --training_steps 1 --set model_config.ffn=moe \
  --set model_config.n_experts=4 --set model_config.mlp_hidden=32 >/dev/null 2>&1
expect_error "MoE with MHA is refused" "ffn 'moe' with attention 'mha'" \
  "$BIN" checkpoint export runs/moemha/checkpoints/step_00000001 --format hf --output hf_moemha
"$BIN" train --config base.json --name jax --fresh --training_steps 1 "${V3[@]}" --set model_config.mlp_activation=gelu \
  --set model_config.mla_latent_norm=false --set model_config.router_score=softmax >/dev/null 2>&1
out=$("$BIN" checkpoint export runs/jax/checkpoints/step_00000001 --format hf --output hf_jax 2>&1)
check "the Jaxformer model is refused listing all three differences" \
  test $? -ne 0 -a "$(grep -c -e "mlp_activation 'gelu'" -e "mla_latent_norm false" -e "router_score 'softmax'" <<<"$out")" -eq 3
check "nothing written for a refused export" test ! -e hf_jax -a ! -e hf_moemha
expect_error "export into a non-empty dir is refused" "not an empty directory" \
  "$BIN" checkpoint export runs/v3/checkpoints/step_00000006 --format hf --output hf_v3

# HF -> meshtrain -> HF, and (2,2,2) vs one process, from models transformers made.
for kind in llama deepseek_v3; do
  "$PY" "$CHECK" make "$kind" "made_$kind" hf_gelu/tokenizer.json > "make_$kind.log" 2>&1
  check "transformers saves a random $kind model" test $? -eq 0 -a -f "made_$kind/config.json"
  # One step at learning rate 0 leaves the weights as imported.
  out=$("$BIN" train --config base.json --name "rt_$kind" --fresh --init-from-hf "made_$kind" --training_steps 1 \
        --set lr.max_lr=0 --set lr.end_lr=0 2>&1)
  check "$kind: --init-from-hf starts a run" test $? -eq 0
  "$BIN" checkpoint export "runs/rt_$kind/checkpoints/step_00000001" --format hf --output "rt_$kind" >/dev/null 2>&1
  out=$("$PY" "$CHECK" same "made_$kind" "rt_$kind" 2>&1)
  rc=$?
  check "$kind: HF -> meshtrain -> HF gives identical tensors" test $rc -eq 0
  [ $rc -eq 0 ] || printf '%s\n' "$out" | tail -5
  one=$("$BIN" train --config base.json --name "one_$kind" --fresh --init-from-hf "made_$kind" 2>&1)
  check "$kind: trains from HF weights on one process" test $? -eq 0
  mesh=$("${MPIRUN[@]}" -np 8 "$BIN" train --config base.json --name "mesh_$kind" --fresh --init-from-hf "made_$kind" \
         --n_device_axis 2 2 2 2>&1)
  rc=$?
  check "$kind: trains from HF weights on a (2,2,2) mesh" test $rc -eq 0
  [ $rc -eq 0 ] || bad "mesh output" "$mesh"
  metric "runs/one_$kind/metrics.jsonl" loss > "one_$kind.loss"
  metric "runs/mesh_$kind/metrics.jsonl" loss > "mesh_$kind.loss"
  check "$kind: (2,2,2) losses equal one process's ($(tr '\n' ' ' < "one_$kind.loss"))" python3 - "one_$kind.loss" "mesh_$kind.loss" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
sys.exit(0 if len(a) == len(b) == 6 and all(abs(x - y) <= 1e-4 * max(1, abs(x)) for x, y in zip(a, b)) else 1)
PY
done
expect_error "--init-from-hf of a non-HF dir names config.json" "config.json" \
  "$BIN" train --config base.json --name bad --fresh --init-from-hf data
finish
