// FLOPs per token of a model (see flops.h).
#include "meshtrain/model/flops.h"

#include "meshtrain/model/attention.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

namespace {

// Attention's score and value products per token, forward and backward (3x
// the forward's), over every layer, the multi-token prediction modules'
// (layers n_layers + j) included.
double attention_flops_per_token(const ModelConfig& m) {
  const double T = static_cast<double>(m.T), H = static_cast<double>(m.n_head);
  const double hd = static_cast<double>(m.head_dim());
  double attn = 0;
  for (int64_t i = 0; i < m.n_layers() + m.mtp_depth; ++i) {
    const double r = m.attention == AttentionKind::Mla ? static_cast<double>(mla_layer_dhR(m, i)) : 0.0;
    attn += 6 * H * (2 * hd + r) * T;
  }
  return attn;
}

// Every parameter a token uses, the embedding included, whatever
// active_params_scope reports.
double active_params(const ModelConfig& m) {
  ModelConfig all = m;
  all.active_params_scope = ActiveParamsScope::Model;
  return static_cast<double>(count_params(all).active);
}

}  // namespace

double flops_per_token(const ModelConfig& m) {
  // Each multi-token prediction depth runs the shared head once more, a
  // [d, V] GEMM its parameters (counted once, in the embedding) do not show.
  const double mtp_heads = 6.0 * static_cast<double>(m.mtp_depth * m.model_dimension * m.vocab_size);
  return 6.0 * active_params(m) + attention_flops_per_token(m) + mtp_heads;
}

PassCostRatios pass_cost_ratios(const ModelConfig& m) {
  const double gemm = 2 * active_params(m), attn = attention_flops_per_token(m) / 3;
  return {(gemm + 2 * attn) / (gemm + attn), gemm / (gemm + attn)};
}

}  // namespace meshtrain
