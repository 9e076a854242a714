#pragma once
// The tiny model of the single-device unit tests (model_test, token_layout_test).
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

}  // namespace meshtrain::test
