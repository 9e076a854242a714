#pragma once
// The tiny models of the single-device unit tests.
#include "meshtrain/config/config.h"

namespace meshtrain::test {

inline ModelConfig tiny_model(AttentionKind attention, FfnKind ffn) {
  ModelConfig c;
  c.model_dimension = 32;
  c.vocab_size = 61;
  c.n_head = 4;
  c.blocks = 2;
  c.layers_per_block = 2;
  c.T = 16;
  c.attention = attention;
  c.ffn = ffn;
  c.latent_dim = 16;
  c.dhR = 4;
  c.n_experts = 4;
  c.k = 2;
  c.n_shared = 1;
  c.mlp_hidden = 24;
  c.capacity_factor = 0;  // no drops: the tests compare exact losses and logits
  c.init_std = 0.1;       // larger than 0.02 so logits differ visibly between tokens
  return c;
}

// DeepSeek-V3's options (hf_model.h) at a tiny size: MLA with a normed
// latent, sigmoid-routed grouped MoE with a shared expert and a score bias,
// a dense first layer (hf_test, mtp_test).
inline ModelConfig tiny_v3_model() {
  ModelConfig m;
  m.model_dimension = 32;
  m.n_head = 4;
  m.vocab_size = 50;
  m.attention = AttentionKind::Mla;
  m.latent_dim = 16;
  m.dhR = 4;
  m.mla_latent_norm = true;
  m.ffn = FfnKind::Moe;
  m.n_experts = 4;
  m.k = 2;
  m.n_shared = 1;
  m.mlp_hidden = 16;
  m.mlp_activation = MlpActivation::Swiglu;
  m.router_score = RouterScore::Sigmoid;
  m.router_bias = true;
  m.routed_scaling_factor = 2.5;
  m.n_group = 2;
  m.first_k_dense = 1;
  m.dense_mlp_hidden = 24;
  m.mla_last_layer_no_rope = false;
  return m;
}

}  // namespace meshtrain::test
