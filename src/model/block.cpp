// The transformer layer: pre-norm attention and feed-forward with residuals.
#include <torch/torch.h>

#include <string>

#include "block.h"
#include "meshtrain/core/check.h"
#include "meshtrain/model/activation.h"

namespace meshtrain {

DenseMLP::DenseMLP(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix)
    : activation_(cfg.mlp_activation), precision_(factory.precision()) {
  const int64_t d = cfg.model_dimension, hidden = cfg.dense_hidden_dim();
  w_in_ = register_module("w_in", factory.column(prefix + ".w_in", d, hidden, cfg.init_std, cfg.linear_bias));
  if (cfg.gated_mlp())
    w_gate_ = register_module("w_gate", factory.column(prefix + ".w_gate", d, hidden, cfg.init_std, cfg.linear_bias));
  w_out_ = register_module("w_out", factory.row(prefix + ".w_out", hidden, d, residual_std(cfg), cfg.linear_bias));
}

at::Tensor DenseMLP::forward(const at::Tensor& x, const at::Tensor& residual) {
  return mlp_forward(activation_, *w_in_, w_gate_.get(), *w_out_, x, residual, *precision_);
}

Block::Block(const ModelConfig& cfg, LayerFactory& factory, int64_t layer, const std::string& name)
    : cfg_(cfg), dropout_(factory.dropout_rng()) {
  const std::string prefix = name.empty() ? "layers." + std::to_string(layer) : name;
  const int64_t d = cfg.model_dimension;
  attn_norm_ = register_module("attn_norm", factory.norm(prefix + ".attn_norm", d, cfg.norm_bias));
  if (cfg.attention == AttentionKind::Mha)
    attn_ = register_module("attn", std::make_shared<MHA>(cfg, factory, prefix + ".attn"));
  else
    attn_ = register_module("attn", std::make_shared<MLA>(cfg, factory, prefix + ".attn", mla_layer_dhR(cfg, layer)));
  mlp_norm_ = register_module("mlp_norm", factory.norm(prefix + ".mlp_norm", d, cfg.norm_bias));
  if (is_moe_layer(cfg, layer))
    moe_ = register_module("moe", std::make_shared<MoE>(cfg, factory, prefix + ".moe"));
  else
    mlp_ = register_module("mlp", std::make_shared<DenseMLP>(cfg, factory, prefix + ".mlp"));
}

at::Tensor Block::forward(at::Tensor h, ForwardAux* aux, LayerCache* cache, int64_t offset,
                          const TokenLayout* layout) {
  // Decoding (a cache) and evaluation keep no graph: nothing to recompute.
  const bool recompute = is_training() && cache == nullptr;
  if (recompute && checkpointing_ == ActivationCheckpointing::Full) {
    // The layout outlives the backward pass (its microbatch does).
    return recompute_in_backward(
        [this, layout](const at::Tensor& x, ForwardAux* a) { return layer(x, a, nullptr, 0, false, layout); }, h,
        aux);
  }
  return layer(h, aux, cache, offset, recompute && checkpointing_ == ActivationCheckpointing::Selective, layout);
}

at::Tensor Block::layer(at::Tensor h, ForwardAux* aux, LayerCache* cache, int64_t offset, bool recompute_ffn,
                        const TokenLayout* layout) {
  const double p = is_training() ? cfg_.dropout_rate : 0.0;
  const Segment ffn = [this, layout](const at::Tensor& in, ForwardAux* a) {
    return moe_ ? moe_->forward(in, a, layout) : mlp_->forward(in);
  };
  if (p > 0) {
    // Dropout sits between each sublayer and its residual add: the add is
    // fused with the next norm instead (one kernel each way, ops/fused.h),
    // and the first norm passes the stream on (forward_keep), so the skip's
    // gradient is summed inside that norm's backward kernel.
    auto [r, normed] = attn_norm_->forward_keep(h);
    const at::Tensor attn = attn_->forward(normed, cache, offset, {}, layout);
    const at::Tensor a = dropout_->stream(h.device(), [&] { return at::dropout(attn, p, true); });
    at::Tensor x;
    std::tie(h, x) = mlp_norm_->forward_add(r, a);
    const auto y = recompute_ffn ? recompute_in_backward(ffn, x, aux) : ffn(x, aux);
    return h + dropout_->stream(h.device(), [&] { return at::dropout(y, p, true); });
  }
  // Without dropout both residual adds fold into the output GEMMs, and each
  // norm passes the stream on (forward_keep), so the stream's gradient is
  // summed inside the norms' backward kernels: no add kernel either way.
  auto [r, y] = attn_norm_->forward_keep(h);
  h = attn_->forward(y, cache, offset, r, layout);
  at::Tensor x;
  std::tie(r, x) = mlp_norm_->forward_keep(h);
  if (mlp_ && !recompute_ffn) return mlp_->forward(x, r);
  return r + (recompute_ffn ? recompute_in_backward(ffn, x, aux) : ffn(x, aux));
}

}  // namespace meshtrain
