// meshtrain tensors <-> stock Llama / DeepSeek-V3 tensors (the table in hf_model.h).
#include <torch/torch.h>

#include <cmath>
#include <functional>

#include "meshtrain/core/check.h"
#include "meshtrain/hf/hf_model.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

namespace {

// Rope rows [.., R, in] in meshtrain's half-split order (dim j pairs with
// j + R/2) -> V3's interleaved order (pairs adjacent: row 2j = j, 2j+1 = j + R/2).
// V3's apply_rotary_pos_emb_interleave undoes exactly this before rotate_half.
at::Tensor interleave_rows(const at::Tensor& x) {
  const int64_t R = x.size(-2);
  return at::stack({x.narrow(-2, 0, R / 2), x.narrow(-2, R / 2, R / 2)}, -2).reshape(x.sizes());
}

at::Tensor deinterleave_rows(const at::Tensor& x) {
  std::vector<int64_t> pairs = x.sizes().vec();
  const int64_t R = pairs[pairs.size() - 2];
  pairs[pairs.size() - 2] = R / 2;
  pairs.insert(pairs.end() - 1, 2);
  const at::Tensor v = x.reshape(pairs);  // [.., R/2, 2, in]
  return at::cat({v.select(-2, 0), v.select(-2, 1)}, -2);
}

// Scale of the nope query rows that gives a rope-less MLA layer (scores over
// hd dims) its own attention scale inside V3's (hd + dhR)-dim scaling.
double no_rope_scale(const ModelConfig& m) {
  return std::sqrt(static_cast<double>(m.head_dim() + m.dhR) / static_cast<double>(m.head_dim()));
}

std::string layer(int64_t i) { return "layers." + std::to_string(i) + "."; }
std::string hf_layer(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

using Put = std::function<void(const std::string&, const at::Tensor&)>;

// Decoder layer i (its kind from the config's layer rule) from meshtrain
// names under q ("layers.i.", or a multi-token prediction module's
// "mtp.j.block.") to HF names under p.
void layer_to_hf(const ModelConfig& m, int64_t i, const std::string& q, const std::string& p, const TensorSource& mt,
                 const Put& put) {
  const int64_t H = m.n_head, hd = m.head_dim(), R = m.dhR, Lt = m.latent_dim;
  put(p + "input_layernorm.weight", mt(q + "attn_norm.weight"));
  put(p + "post_attention_layernorm.weight", mt(q + "mlp_norm.weight"));
  if (m.attention == AttentionKind::Mha) {
    put(p + "self_attn.q_proj.weight", mt(q + "attn.wq.weight"));
    put(p + "self_attn.k_proj.weight", mt(q + "attn.wk.weight"));
    put(p + "self_attn.v_proj.weight", mt(q + "attn.wv.weight"));
    put(p + "self_attn.o_proj.weight", mt(q + "attn.wo.weight"));
  } else {
    const at::Tensor w_uq = mt(q + "attn.w_uq.weight");
    const bool rope = mla_layer_dhR(m, i) > 0;
    const auto opts = w_uq.options();
    const at::Tensor qr = rope ? interleave_rows(mt(q + "attn.w_qr.weight").view({H, R, Lt})) : at::zeros({H, R, Lt}, opts);
    const at::Tensor uq = rope ? w_uq : w_uq * no_rope_scale(m);
    const at::Tensor w_dkv = mt(q + "attn.w_dkv.weight");
    const at::Tensor kr = rope ? interleave_rows(mt(q + "attn.w_kr.weight")) : at::zeros({R, w_dkv.size(1)}, opts);
    put(p + "self_attn.q_a_proj.weight", mt(q + "attn.w_dq.weight"));
    put(p + "self_attn.q_a_layernorm.weight", mt(q + "attn.q_norm.weight"));
    put(p + "self_attn.q_b_proj.weight", at::cat({uq.view({H, hd, Lt}), qr}, 1).reshape({H * (hd + R), Lt}));
    put(p + "self_attn.kv_a_proj_with_mqa.weight", at::cat({w_dkv, kr}, 0));
    put(p + "self_attn.kv_a_layernorm.weight", mt(q + "attn.kv_norm.weight"));
    put(p + "self_attn.kv_b_proj.weight",
        at::cat({mt(q + "attn.w_uk.weight").view({H, hd, Lt}), mt(q + "attn.w_uv.weight").view({H, hd, Lt})}, 1)
            .reshape({H * 2 * hd, Lt}));
    put(p + "self_attn.o_proj.weight", mt(q + "attn.wo.weight"));
  }
  if (is_moe_layer(m, i)) {
    const std::string e = q + "moe.";
    put(p + "mlp.gate.weight", mt(e + "router.weight"));
    put(p + "mlp.gate.e_score_correction_bias", m.router_bias ? mt(e + "score_bias") : at::zeros({m.n_experts}));
    const at::Tensor g = mt(e + "experts.w_gate"), u = mt(e + "experts.w_in"), dn = mt(e + "experts.w_out");
    for (int64_t x = 0; x < m.n_experts; ++x) {
      const std::string h = p + "mlp.experts." + std::to_string(x) + ".";
      put(h + "gate_proj.weight", g[x]);
      put(h + "up_proj.weight", u[x]);
      put(h + "down_proj.weight", dn[x]);
    }
    const std::string s = p + "mlp.shared_experts.";
    if (m.n_shared > 0) {
      put(s + "gate_proj.weight", mt(e + "shared.w_gate.weight"));
      put(s + "up_proj.weight", mt(e + "shared.w_in.weight"));
      put(s + "down_proj.weight", mt(e + "shared.w_out.weight"));
    } else {
      // V3 always runs one shared expert: a zero down projection makes it add nothing.
      const int64_t hid = m.hidden_dim(), d = m.model_dimension;
      put(s + "gate_proj.weight", at::zeros({hid, d}, g.options()));  // meta when only shapes are asked
      put(s + "up_proj.weight", at::zeros({hid, d}, g.options()));
      put(s + "down_proj.weight", at::zeros({d, hid}, g.options()));
    }
  } else if (m.gated_mlp()) {
    put(p + "mlp.gate_proj.weight", mt(q + "mlp.w_gate.weight"));
    put(p + "mlp.up_proj.weight", mt(q + "mlp.w_in.weight"));
    put(p + "mlp.down_proj.weight", mt(q + "mlp.w_out.weight"));
  } else {
    // gelu(w_in x) = act(gate x) * up(x) with gate = w_in and up(x) = 0 x + 1.
    const at::Tensor w_in = mt(q + "mlp.w_in.weight"), w_out = mt(q + "mlp.w_out.weight");
    put(p + "mlp.gate_proj.weight", w_in);
    put(p + "mlp.gate_proj.bias", at::zeros({w_in.size(0)}, w_in.options()));
    put(p + "mlp.up_proj.weight", at::zeros_like(w_in));
    put(p + "mlp.up_proj.bias", at::ones({w_in.size(0)}, w_in.options()));
    put(p + "mlp.down_proj.weight", w_out);
    put(p + "mlp.down_proj.bias", at::zeros({w_out.size(0)}, w_out.options()));
  }
}

// The inverse of layer_to_hf.
void layer_from_hf(const ModelConfig& m, int64_t i, const std::string& q, const std::string& p, const TensorSource& hf,
                   const Put& put) {
  const int64_t H = m.n_head, hd = m.head_dim(), R = m.dhR, Lt = m.latent_dim;
  const auto expect_shape = [](const std::string& name, const at::Tensor& t, std::vector<int64_t> shape) {
    MT_CHECK(t.sizes().vec() == shape, "Hugging Face tensor ", name, " has shape ", t.sizes(), ", config.json implies ",
             at::IntArrayRef(shape));
    return t;
  };
  put(q + "attn_norm.weight", hf(p + "input_layernorm.weight"));
  put(q + "mlp_norm.weight", hf(p + "post_attention_layernorm.weight"));
  if (m.attention == AttentionKind::Mha) {
    put(q + "attn.wq.weight", hf(p + "self_attn.q_proj.weight"));
    put(q + "attn.wk.weight", hf(p + "self_attn.k_proj.weight"));
    put(q + "attn.wv.weight", hf(p + "self_attn.v_proj.weight"));
    put(q + "attn.wo.weight", hf(p + "self_attn.o_proj.weight"));
  } else {
    const bool rope = mla_layer_dhR(m, i) > 0;
    const std::string qb = p + "self_attn.q_b_proj.weight", kva = p + "self_attn.kv_a_proj_with_mqa.weight",
                      kvb = p + "self_attn.kv_b_proj.weight";
    const at::Tensor q_b = expect_shape(qb, hf(qb), {H * (hd + R), Lt}).view({H, hd + R, Lt});
    const at::Tensor kv_a = hf(kva);
    MT_CHECK(kv_a.dim() == 2 && kv_a.size(0) == Lt + R, "Hugging Face tensor ", kva, " has shape ", kv_a.sizes(),
             ", config.json implies [", Lt + R, ", hidden_size]");
    const at::Tensor kv_b = expect_shape(kvb, hf(kvb), {H * 2 * hd, Lt}).view({H, 2 * hd, Lt});
    const at::Tensor uq = q_b.narrow(1, 0, hd).reshape({H * hd, Lt});
    put(q + "attn.w_dq.weight", hf(p + "self_attn.q_a_proj.weight"));
    put(q + "attn.q_norm.weight", hf(p + "self_attn.q_a_layernorm.weight"));
    put(q + "attn.w_uq.weight", rope ? uq : uq / no_rope_scale(m));
    put(q + "attn.w_dkv.weight", kv_a.narrow(0, 0, Lt));
    if (rope) {
      put(q + "attn.w_qr.weight", deinterleave_rows(q_b.narrow(1, hd, R)).reshape({H * R, Lt}));
      put(q + "attn.w_kr.weight", deinterleave_rows(kv_a.narrow(0, Lt, R)));
    }
    put(q + "attn.kv_norm.weight", hf(p + "self_attn.kv_a_layernorm.weight"));
    put(q + "attn.w_uk.weight", kv_b.narrow(1, 0, hd).reshape({H * hd, Lt}));
    put(q + "attn.w_uv.weight", kv_b.narrow(1, hd, hd).reshape({H * hd, Lt}));
    put(q + "attn.wo.weight", hf(p + "self_attn.o_proj.weight"));
  }
  if (is_moe_layer(m, i)) {
    const std::string e = q + "moe.";
    put(e + "router.weight", hf(p + "mlp.gate.weight"));
    if (m.router_bias) put(e + "score_bias", hf(p + "mlp.gate.e_score_correction_bias").to(at::kFloat));
    std::vector<at::Tensor> g, u, dn;
    for (int64_t x = 0; x < m.n_experts; ++x) {
      const std::string h = p + "mlp.experts." + std::to_string(x) + ".";
      g.push_back(hf(h + "gate_proj.weight"));
      u.push_back(hf(h + "up_proj.weight"));
      dn.push_back(hf(h + "down_proj.weight"));
    }
    put(e + "experts.w_gate", at::stack(g));
    put(e + "experts.w_in", at::stack(u));
    put(e + "experts.w_out", at::stack(dn));
    if (m.n_shared > 0) {
      const std::string s = p + "mlp.shared_experts.";
      put(e + "shared.w_gate.weight", hf(s + "gate_proj.weight"));
      put(e + "shared.w_in.weight", hf(s + "up_proj.weight"));
      put(e + "shared.w_out.weight", hf(s + "down_proj.weight"));
    }
  } else if (m.gated_mlp()) {
    put(q + "mlp.w_gate.weight", hf(p + "mlp.gate_proj.weight"));
    put(q + "mlp.w_in.weight", hf(p + "mlp.up_proj.weight"));
    put(q + "mlp.w_out.weight", hf(p + "mlp.down_proj.weight"));
  } else {
    // Only meshtrain's own GELU export pattern is exact (hf_model.h).
    const bool pattern = hf(p + "mlp.gate_proj.bias").eq(0).all().item<bool>() &&
                         hf(p + "mlp.up_proj.weight").eq(0).all().item<bool>() &&
                         hf(p + "mlp.up_proj.bias").eq(1).all().item<bool>() &&
                         hf(p + "mlp.down_proj.bias").eq(0).all().item<bool>();
    MT_CHECK(pattern, "Hugging Face layer ", i, ": a gelu_pytorch_tanh MLP with biases is read only in meshtrain's "
             "GELU form (gate bias 0, up weight 0 and bias 1, down bias 0); this one is a general gated MLP");
    put(q + "mlp.w_in.weight", hf(p + "mlp.gate_proj.weight"));
    put(q + "mlp.w_out.weight", hf(p + "mlp.down_proj.weight"));
  }
}

}  // namespace

NamedTensors to_hf_tensors(const ModelConfig& m, const TensorSource& mt) {
  const auto why = hf_unmappable(m);
  MT_CHECK(why.empty(), "to_hf_tensors: model has no stock Hugging Face equivalent");
  const int64_t V = m.vocab_size, L = m.n_layers();
  NamedTensors out;
  const Put put = [&](const std::string& name, const at::Tensor& t) { out.emplace_back(name, t.contiguous()); };
  const at::Tensor embed = mt("embed.weight").narrow(0, 0, V);  // vocabulary padding dropped
  put("model.embed_tokens.weight", embed);
  for (int64_t i = 0; i < L; ++i) layer_to_hf(m, i, layer(i), hf_layer(i), mt, put);
  put("model.norm.weight", mt("final_norm.weight"));
  if (!m.tie_embeddings) put("lm_head.weight", mt("head.weight").narrow(0, 0, V));
  // Multi-token prediction module j is DeepSeek-V3's layer L + j: its block,
  // enorm, hnorm, eh_proj, shared_head.norm, and (as the published
  // checkpoint) copies of the shared embedding and head.
  for (int64_t j = 0; j < m.mtp_depth; ++j) {
    const std::string q = "mtp." + std::to_string(j) + ".", p = hf_layer(L + j);
    layer_to_hf(m, L + j, q + "block.", p, mt, put);
    put(p + "enorm.weight", mt(q + "enorm.weight"));
    put(p + "hnorm.weight", mt(q + "hnorm.weight"));
    put(p + "eh_proj.weight", mt(q + "eh_proj.weight"));
    put(p + "shared_head.norm.weight", mt(q + "head_norm.weight"));
    put(p + "embed_tokens.weight", embed);
    put(p + "shared_head.head.weight", m.tie_embeddings ? embed : mt("head.weight").narrow(0, 0, V));
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensor_shapes(const ModelConfig& m) {
  MetaLayerFactory meta;
  Transformer model(m, meta);
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = p.value();
  const NamedTensors hf = to_hf_tensors(m, [&](const std::string& name) {
    const auto it = params.find(name);
    MT_ASSERT(it != params.end(), "hf_tensor_shapes: the model has no parameter '", name, "'");
    return it->second;
  });
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [name, t] : hf) out.emplace_back(name, t.sizes().vec());
  return out;
}

std::map<std::string, at::Tensor> from_hf_tensors(const ModelConfig& m, const TensorSource& hf) {
  const int64_t L = m.n_layers();
  std::map<std::string, at::Tensor> out;
  // Shapes are checked against the model when the trainer copies them in.
  const Put put = [&](const std::string& name, const at::Tensor& t) { out[name] = t.contiguous(); };
  put("embed.weight", hf("model.embed_tokens.weight"));
  for (int64_t i = 0; i < L; ++i) layer_from_hf(m, i, layer(i), hf_layer(i), hf, put);
  put("final_norm.weight", hf("model.norm.weight"));
  if (!m.tie_embeddings) put("head.weight", hf("lm_head.weight"));
  // The MTP layers' embed_tokens and shared_head.head are copies of the shared ones.
  for (int64_t j = 0; j < m.mtp_depth; ++j) {
    const std::string q = "mtp." + std::to_string(j) + ".", p = hf_layer(L + j);
    layer_from_hf(m, L + j, q + "block.", p, hf, put);
    put(q + "enorm.weight", hf(p + "enorm.weight"));
    put(q + "hnorm.weight", hf(p + "hnorm.weight"));
    put(q + "eh_proj.weight", hf(p + "eh_proj.weight"));
    put(q + "head_norm.weight", hf(p + "shared_head.norm.weight"));
  }
  return out;
}

}  // namespace meshtrain
