#pragma once
// meshtrain's model <-> the stock Hugging Face classes LlamaForCausalLM (MHA +
// dense MLP) and DeepseekV3ForCausalLM (MLA, dense or MoE), exactly: same
// math, tensors rearranged, never approximated. Pure functions of tensors and
// JSON; hf_dir.h does the files.
//
// Tensors (meshtrain global names, see transformer.h <-> HF names, layer i):
//   embed.weight [V(+pad), d]            model.embed_tokens.weight (first V rows)
//   head.weight (untied)                 lm_head.weight
//   final_norm.weight                    model.norm.weight
//   layers.i.attn_norm / mlp_norm        model.layers.i.input_layernorm / post_attention_layernorm
//   MHA attn.wq / wk / wv / wo           self_attn.q_proj / k_proj / v_proj / o_proj
//   MLA attn.w_dq, attn.q_norm           self_attn.q_a_proj, q_a_layernorm
//       attn.w_uq + attn.w_qr            self_attn.q_b_proj (per head: nope rows, then rope rows)
//       attn.w_dkv + attn.w_kr           self_attn.kv_a_proj_with_mqa (latent rows, then rope rows)
//       attn.kv_norm                     self_attn.kv_a_layernorm
//       attn.w_uk + attn.w_uv            self_attn.kv_b_proj (per head: k rows, then v rows)
//   mlp.w_gate / w_in / w_out            mlp.gate_proj / up_proj / down_proj
//   moe.router, moe.score_bias           mlp.gate.weight, mlp.gate.e_score_correction_bias
//   moe.experts.w_gate/w_in/w_out [E,..] mlp.experts.e.gate_proj / up_proj / down_proj
//   moe.shared.w_gate/w_in/w_out         mlp.shared_experts.gate_proj / up_proj / down_proj
// Rope rows of MLA are permuted to V3's interleaved layout (rope_interleave);
// MLA's rope-less layers (mla_last_layer_no_rope) get zero rope rows and the
// nope query rows scaled by sqrt((hd + dhR) / hd), which restores their
// attention scale; the dense GELU MLP becomes Llama's gated MLP with
// gate = w_in, up = 0 weight + 1 bias (mlp_bias, gelu_pytorch_tanh).
#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

// Full (unsharded) tensor by name; throws when missing.
using TensorSource = std::function<at::Tensor(const std::string&)>;
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// What of m has no exact stock equivalent, one line each (empty: exportable).
std::vector<std::string> hf_unmappable(const ModelConfig& m);
// "llama" or "deepseek_v3" (m must be mappable).
std::string hf_model_type(const ModelConfig& m);

// config.json for m (bos/eos: the tokenizer's end-of-text id).
nlohmann::json hf_config_json(const ModelConfig& m, int64_t eos_token_id);
// model_config from an HF config.json: the architecture keys come from j, the
// rest (T, dropout, capacity, init, dtype) stay as in base. Throws listing
// every field that meshtrain cannot express.
ModelConfig model_config_from_hf(const nlohmann::json& j, const ModelConfig& base);

// meshtrain tensors (by global name, vocab rows possibly padded) -> HF tensors.
NamedTensors to_hf_tensors(const ModelConfig& m, const TensorSource& mt);
// Every HF tensor model m implies, with its shape (HF's own, unpadded
// vocabulary), in to_hf_tensors' order: what an import accounts the files
// against. Computed by running to_hf_tensors on a model built on the meta
// device, so it cannot drift from the export.
std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensor_shapes(const ModelConfig& m);
// HF tensors -> meshtrain tensors by global name (unpadded vocabulary). The
// Llama GELU pattern (mlp_bias) is checked, not assumed.
std::map<std::string, at::Tensor> from_hf_tensors(const ModelConfig& m, const TensorSource& hf);

}  // namespace meshtrain
