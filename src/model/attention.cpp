// MHA and MLA over [B, H, T, dim] heads with at::scaled_dot_product_attention.
#include <ATen/SDPBackend.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/ops/fused.h"
#include "meshtrain/ops/paths.h"

namespace meshtrain {

namespace {

// [B, T, H*dim] -> [B, H, T, dim]
at::Tensor split_heads(const at::Tensor& x, int64_t dim) {
  MT_ASSERT(x.size(-1) % dim == 0, "width ", x.size(-1), " not a multiple of head dim ", dim);
  return x.view({x.size(0), x.size(1), x.size(-1) / dim, dim}).transpose(1, 2);
}

// [B, H, T, dim] -> [B, T, H*dim]
at::Tensor merge_heads(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

// The output projection, with the residual add folded in when one is given.
at::Tensor project_out(Linear& wo, const at::Tensor& heads, const at::Tensor& residual) {
  return residual.defined() ? wo.forward_residual(heads, residual) : wo.forward(heads);
}

at::Tensor append(const at::Tensor& past, const at::Tensor& now, int64_t dim) {
  return past.defined() ? at::cat({past, now}, dim) : now;
}

// One GEMM for the projections of one input by several layers whose forward
// is exactly matmul(input(x), weight()^T) + bias() and whose input() is the
// same (replicated layers: x itself; column layers: the tp region entry):
// x is read once, and its gradient is one GEMM's output instead of a sum
// of several added by autograd (the split's backward concatenates the
// outputs' gradients: cheaper only where they are narrower than x). The parameters stay the
// layers' own, so checkpoints and tp shards keep their layout.
std::vector<at::Tensor> fused_projections(MixedPrecision& mp, const at::Tensor& x, std::vector<Linear*> layers) {
  std::vector<at::Tensor> w, b;
  std::vector<int64_t> widths;
  for (Linear* l : layers) {
    w.push_back(l->weight());
    if (l->bias().defined()) b.push_back(l->bias());
    widths.push_back(l->weight().size(0));
  }
  MT_ASSERT(b.empty() || b.size() == w.size(), "fused projections: biases on some layers only");
  return mp.fused_linear(layers.front()->input(x), w, b).split_with_sizes(widths, -1);
}

// t [..., c] widened to `width` columns, the new ones zero: t copied into
// the first c, only the others zeroed.
at::Tensor widen_last(const at::Tensor& t, int64_t width) {
  std::vector<int64_t> shape = t.sizes().vec();
  const int64_t c = shape.back();
  shape.back() = width;
  at::Tensor out = at::empty(shape, t.options());
  out.narrow(-1, 0, c).copy_(t);
  out.narrow(-1, c, width - c).zero_();
  return out;
}

// v padded with zero columns for the attention kernel, and its output cut
// back, as autograd functions whose gradients are the other one: a view of
// the padded gradient, and the narrow one widened. (constant_pad_nd's
// backward copies the gradient's first columns out; narrow's zeroes a whole
// buffer and copies into it.)
class PadLastFn : public torch::autograd::Function<PadLastFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& t, int64_t width) {
    ctx->saved_data["cols"] = t.size(-1);
    return widen_last(t, width);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {g[0].narrow(-1, 0, ctx->saved_data["cols"].toInt()), at::Tensor()};
  }
};

class NarrowLastFn : public torch::autograd::Function<NarrowLastFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& t, int64_t cols) {
    ctx->saved_data["width"] = t.size(-1);
    return t.narrow(-1, 0, cols);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {widen_last(g[0], ctx->saved_data["width"].toInt()), at::Tensor()};
  }
};

}  // namespace

MHA::MHA(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix)
    : cfg_(cfg), rope_(cfg.rope_theta), factory_(&factory), dropout_(factory.dropout_rng()) {
  const int64_t d = cfg.model_dimension, kv = cfg.kv_heads(), hd = cfg.head_dim();
  const bool b = cfg.linear_bias;
  wq_ = register_module("wq", factory.column(prefix + ".wq", d, d, cfg.init_std, b));
  wk_ = register_module("wk", factory.kv_heads(prefix + ".wk", d, kv, hd, cfg.init_std, b));
  wv_ = register_module("wv", factory.kv_heads(prefix + ".wv", d, kv, hd, cfg.init_std, b));
  wo_ = register_module("wo", factory.row(prefix + ".wo", d, d, residual_std(cfg), b));
}

at::Tensor MHA::forward(const at::Tensor& x, LayerCache* cache, int64_t offset, const at::Tensor& residual,
                       const TokenLayout* layout) {
  const int64_t hd = cfg_.head_dim();
  // One GEMM for q, k and v: the three weights (each this rank's heads) are
  // concatenated per call, which moves only the weights; the parameters stay
  // three, so checkpoints and tp shards keep their layout.
  at::Tensor q, k, v;
  if (cfg_.kv_heads() == cfg_.n_head) {
    const std::vector<at::Tensor> w = {wq_->weight(), wk_->weight(), wv_->weight()};
    const std::vector<at::Tensor> b =
        cfg_.linear_bias ? std::vector<at::Tensor>{wq_->bias(), wk_->bias(), wv_->bias()} : std::vector<at::Tensor>{};
    const at::Tensor qkv = factory_->precision()->fused_linear(wq_->input(x), w, b);  // [B, T, 3 * H * hd]
    const int64_t B = qkv.size(0), T = qkv.size(1), H = qkv.size(2) / (3 * hd);
    // q and k rotated together by one kernel; v stays a slice of qkv, and the
    // backward writes d(qkv) directly (ops/fused.h).
    if (!layout) {
      std::tie(q, k, v) =
          ops::qkv_rope(qkv.view({B, T, 3, H, hd}), rope_.tables(hd, offset + T, qkv.device()), offset);
    } else {
      // Each token at its own position: the rows [1, B * T] with a table row each.
      const auto rows = ops::qkv_rope(qkv.view({1, B * T, 3, H, hd}),
                                      rope_.tables_at(hd, layout->positions, cfg_.T, qkv.device()), 0);
      const auto unfold = [&](const at::Tensor& t) { return t.transpose(1, 2).view({B, T, H, hd}).transpose(1, 2); };
      q = unfold(std::get<0>(rows));
      k = unfold(std::get<1>(rows));
      v = unfold(std::get<2>(rows));
    }
  } else {
    // Grouped-query attention: fewer kv heads, so q and k rotate apart.
    const auto heads = [&](const at::Tensor& t) { return t.view({t.size(0), t.size(1), -1, hd}); };
    const auto rotate = [&](const at::Tensor& t) {
      return layout ? rope_.apply_at(t, layout->positions, cfg_.T) : rope_.apply(t, offset, 1);
    };
    q = rotate(heads(wq_->forward(x))).transpose(1, 2);
    k = heads(wk_->forward(x));  // this rank's kv heads (LayerFactory::kv_heads)
    v = heads(wv_->forward(x));
    k = rotate(k).transpose(1, 2);  // [B, KV, T, hd]
    v = v.transpose(1, 2);
  }
  if (cache) {
    cache->a = k = append(cache->a, k, 2);
    cache->b = v = append(cache->b, v, 2);
  }
  // Context parallelism: the whole sequence's keys and values (this rank's
  // kv heads, before the GQA repeat: the fewest bytes).
  if (layout && layout->gather) {
    k = layout->gather(k, 2);
    v = layout->gather(v, 2);
  }
  const int64_t group = q.size(1) / k.size(1);
  if (group > 1) {
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
  }
  const double p = is_training() ? cfg_.dropout_rate : 0.0;
  const auto attend = [&] { return layout ? layout_attention(q, k, v, p, *layout) : causal_attention(q, k, v, p); };
  if (p == 0) return project_out(*wo_, merge_heads(attend()), residual);
  const at::Tensor o = dropout_->sharded(q.device(), attend);
  return project_out(*wo_, merge_heads(o), residual);
}

MLA::MLA(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix, int64_t dhR)
    : cfg_(cfg), factory_(&factory), dropout_(factory.dropout_rng()), dhR_(dhR), rope_(cfg.rope_theta) {
  const int64_t d = cfg.model_dimension, L = cfg.latent_dim, H = cfg.n_head, hd = cfg.head_dim();
  MT_CHECK(L > 0, "model_config.latent_dim must be > 0 for attention \"mla\"");
  const double s = cfg.init_std;
  const bool b = cfg.linear_bias;
  w_dkv_ = register_module("w_dkv", factory.replicated(prefix + ".w_dkv", d, L, s, b, SequenceInput::Shard));
  w_dq_ = register_module("w_dq", factory.replicated(prefix + ".w_dq", d, L, s, b, SequenceInput::Shard));
  w_uq_ = register_module("w_uq", factory.column(prefix + ".w_uq", L, H * hd, s, b));
  w_uk_ = register_module("w_uk", factory.column(prefix + ".w_uk", L, H * hd, s, b));
  w_uv_ = register_module("w_uv", factory.column(prefix + ".w_uv", L, H * hd, s, b));
  if (dhR_ > 0) {
    const MlaRopeInputs in = mla_rope_inputs(cfg);
    w_qr_ = register_module("w_qr", factory.column(prefix + ".w_qr", in.q, H * dhR_, s, b));
    w_kr_ = register_module("w_kr", factory.replicated(prefix + ".w_kr", in.k, dhR_, s, b, SequenceInput::Shard));
  }
  wo_ = register_module("wo", factory.row(prefix + ".wo", H * hd, d, residual_std(cfg), b));
  if (cfg.mla_latent_norm) {
    q_norm_ = register_module("q_norm", factory.norm(prefix + ".q_norm", L, false));
    kv_norm_ = register_module("kv_norm", factory.norm(prefix + ".kv_norm", L, false));
  }
}

at::Tensor MLA::forward(const at::Tensor& x, LayerCache* cache, int64_t offset, const at::Tensor& residual,
                       const TokenLayout* layout) {
  const int64_t hd = cfg_.head_dim();
  MixedPrecision& mp = *factory_->precision();
  // Jaxformer's rope projections read the whole down-projection output
  // [c_kv, c_q] (model.py: Dense(dhR)(x) after x = Dense(2 * latent_dim)(x));
  // DeepSeek's read x (the rope key) and c_q (the rope queries), which makes
  // them one GEMM with the projections that read the same input.
  const bool joint = dhR_ > 0 && cfg_.mla_rope_input == MlaRopeInput::JointLatent;
  const bool split_rope = dhR_ > 0 && !joint;
  const auto down = fused_projections(mp, x, split_rope ? std::vector<Linear*>{w_dkv_.get(), w_dq_.get(), w_kr_.get()}
                                                        : std::vector<Linear*>{w_dkv_.get(), w_dq_.get()});
  at::Tensor c = down[0], cq = down[1];  // [B, T, L]
  if (q_norm_) {
    c = kv_norm_->forward(c);
    cq = q_norm_->forward(cq);
  }
  // (Not so the up-projections: their outputs are wider than their input,
  // and the split's backward would copy those gradients together.)
  auto q = split_heads(w_uq_->forward(cq), hd);  // [B, H, T, hd]
  at::Tensor k_rope;                             // [B, t, dhR], rotated
  if (dhR_ > 0) {
    const at::Tensor latent = joint ? at::cat({c, cq}, -1) : at::Tensor();
    const at::Tensor qr = w_qr_->forward(joint ? latent : cq);
    if (layout) {
      q = at::cat(
          {q, rope_.apply_at(qr.view({qr.size(0), qr.size(1), -1, dhR_}), layout->positions, cfg_.T).transpose(1, 2)},
          -1);
    } else {
      q = ops::rope_concat(q, split_heads(qr, dhR_), rope_.tables(dhR_, offset + qr.size(1), qr.device()), offset, 2);
    }
    // The rope key is computed once (replicated) but read by this rank's heads
    // only: entering the tp region sums its gradient over all heads (and, under
    // sequence parallelism, gathers the whole sequence before rotating it).
    const at::Tensor kr = factory_->enter_tp(joint ? w_kr_->forward(latent) : down[2]);
    k_rope = layout ? rope_.apply_at(kr, layout->positions, cfg_.T) : rope_.apply(kr, offset, 1);
  }
  if (cache) {
    cache->a = c = append(cache->a, c, 1);
    if (dhR_ > 0) cache->b = k_rope = append(cache->b, k_rope, 1);
  }
  at::Tensor k, v;
  if (layout && layout->gather && !mp.fp8()) {
    // Context parallelism exchanges the latent (and the rope key), not the
    // keys and values; each rank expands the whole sequence's latent itself.
    // w_uk and w_uv read the same tp region entry. (Not under FP8: the
    // up-projections' output gradients would be each rank's partial sums,
    // quantized before they are summed; one process quantizes the sum.)
    const at::Tensor latent = layout->gather(w_uk_->input(c), 1);
    k = split_heads(mp.linear(latent, w_uk_->weight(), w_uk_->bias()), hd);
    v = split_heads(mp.linear(latent, w_uv_->weight(), w_uv_->bias()), hd);
    if (dhR_ > 0) k_rope = layout->gather(k_rope, 1);
  } else {
    k = split_heads(w_uk_->forward(c), hd);  // [B, H, t, hd]
    v = split_heads(w_uv_->forward(c), hd);
    if (layout && layout->gather) {  // FP8 under context parallelism: the whole sequence's keys and values
      k = layout->gather(k, 2);
      v = layout->gather(v, 2);
      if (dhR_ > 0) k_rope = layout->gather(k_rope, 1);
    }
  }
  if (dhR_ > 0) k = at::cat({k, k_rope.unsqueeze(1).expand({-1, k.size(1), -1, -1})}, -1);
  const double p = is_training() ? cfg_.dropout_rate : 0.0;
  // Flash kernels want one head size for q, k and v; the CPU kernels take
  // unequal sizes as they are, cuDNN's narrower values.
  const bool pad = dhR_ > 0 && !v.is_cpu();
  const auto attend = [&] {
    if (layout) return layout_attention(q, k, v, p, *layout);
    return pad ? causal_attention_padded_v(q, k, v, p, value_width(q, k, v, p)) : causal_attention(q, k, v, p);
  };
  const at::Tensor o = p > 0 ? dropout_->sharded(q.device(), attend) : attend();
  return project_out(*wo_, merge_heads(o), residual);
}

// Queries q [B, H, Tq, *] are the last Tq of the Tk key positions. Without a
// past (Tq == Tk) sdpa's is_causal is right; with one it aligns the triangle
// top-left, which is wrong for Tq > 1, so the mask is spelled out.
namespace {

// sdpa's kernel for these inputs, noted as the attention's path (ops/paths.h):
// a fused kernel, or the math fallback, which keeps the whole score matrix.
// Asked only while something counts paths (the choice costs host time).
void note_attention_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout, bool causal) {
  if (!ops::paths_observed()) return;
  switch (static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, k, v, mask, dropout, causal))) {
    case at::SDPBackend::flash_attention: return ops::note_path("attention", true, "flash");
    case at::SDPBackend::cudnn_attention: return ops::note_path("attention", true, "cudnn");
    case at::SDPBackend::efficient_attention: return ops::note_path("attention", true, "efficient");
    default: return ops::note_path("attention", false, "no fused kernel takes these inputs (math: scores in memory)");
  }
}

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                double dropout, bool causal) {
  note_attention_path(q, k, v, mask, dropout, causal);
  return at::scaled_dot_product_attention(q, k, v, mask, dropout, causal);
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout) {
  const int64_t Tq = q.size(2), Tk = k.size(2);
  if (Tq == Tk) return sdpa(q, k, v, {}, dropout, /*causal=*/true);
  if (Tq == 1) return sdpa(q, k, v, {}, dropout, /*causal=*/false);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(q.device());
  const auto qpos = at::arange(Tk - Tq, Tk, opts).unsqueeze(1);
  const auto kpos = at::arange(0, Tk, opts).unsqueeze(0);
  return sdpa(q, k, v, kpos <= qpos, dropout, /*causal=*/false);
}

at::Tensor causal_attention_padded_v(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                                     int64_t width) {
  const int64_t hd = v.size(-1), pad = (width > 0 ? width : q.size(-1)) - hd;
  MT_ASSERT(pad >= 0 && k.size(-1) == q.size(-1), "padded-v attention: q ", q.sizes(), ", k ", k.sizes(), ", v ",
            v.sizes(), ", width ", width);
  if (pad == 0) return causal_attention(q, k, v, dropout);
  // Zero columns of v give zero output columns; the first hd are unchanged
  // (the softmax weights come from q and k alone).
  return NarrowLastFn::apply(causal_attention(q, k, PadLastFn::apply(v, hd + pad), dropout), hd);
}

int64_t narrowest_value_width(int64_t v_width, int64_t qk_width, const std::function<int64_t(int64_t)>& choose) {
  MT_ASSERT(0 < v_width && v_width <= qk_width, "value width ", v_width, " against a query width of ", qk_width);
  if (v_width == qk_width) return qk_width;
  const int64_t want = choose(qk_width);
  std::vector<int64_t> widths = {v_width};
  for (int64_t w = (v_width / 64 + 1) * 64; w < qk_width; w += 64) widths.push_back(w);
  for (int64_t w : widths)
    if (choose(w) == want) return w;
  return qk_width;
}

int64_t value_width_for(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout) {
  if (v.is_cpu()) return v.size(-1);
  if (!v.is_cuda()) return q.size(-1);
  const bool causal = q.size(2) == k.size(2);
  return narrowest_value_width(v.size(-1), q.size(-1), [&](int64_t w) {
    std::vector<int64_t> shape = v.sizes().vec();
    shape.back() = w;
    // A v as the padding makes it: contiguous, v's dtype and grad mode.
    const at::Tensor candidate = at::empty(shape, v.options()).requires_grad_(v.requires_grad());
    return at::_fused_sdp_choice(q, k, candidate, {}, dropout, causal);
  });
}

int64_t MLA::value_width(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout) {
  std::vector<int64_t> key;
  for (const at::Tensor* t : {&q, &k, &v}) key.insert(key.end(), t->sizes().begin(), t->sizes().end());
  key.insert(key.end(), {static_cast<int64_t>(v.scalar_type()), v.device().index(), v.requires_grad() ? 1 : 0,
                         dropout > 0 ? 1 : 0});
  std::lock_guard<std::mutex> lock(widths_mu_);
  auto it = widths_.find(key);
  if (it == widths_.end()) it = widths_.emplace(key, value_width_for(q, k, v, dropout)).first;
  return it->second;
}

void prefer_attention_backend(AttentionBackend first) {
  // torch's CUDA selection takes its own order (cuDNN's kernels ran first on
  // an H200, the profile's kernel names say), so a choice disables the
  // kernels that would come before it; auto restores torch's defaults. Every
  // flag is set each time: sessions of one process may choose differently.
  at::Context& ctx = at::globalContext();
  const bool cudnn = first == AttentionBackend::Auto || first == AttentionBackend::Cudnn;
  const bool flash = first != AttentionBackend::Efficient && first != AttentionBackend::Math;
  const bool efficient = first != AttentionBackend::Math;
  ctx.setSDPUseCuDNN(cudnn);
  ctx.setSDPUseFlash(first == AttentionBackend::Cudnn ? false : flash);
  ctx.setSDPUseMemEfficient(first == AttentionBackend::Cudnn ? false : efficient);
  ctx.setSDPUseMath(true);  // the fallback for inputs no fused kernel takes
}

std::string attention_backend_for(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  switch (static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, k, v, {}, 0.0, /*is_causal=*/true))) {
    case at::SDPBackend::flash_attention: return "flash";
    case at::SDPBackend::cudnn_attention: return "cudnn";
    case at::SDPBackend::efficient_attention: return "efficient";
    case at::SDPBackend::math: return "math";
    default: return "none";
  }
}

MlaRopeInputs mla_rope_inputs(const ModelConfig& cfg) {
  if (cfg.mla_rope_input == MlaRopeInput::JointLatent) return {2 * cfg.latent_dim, 2 * cfg.latent_dim};
  return {cfg.latent_dim, cfg.model_dimension};
}

int64_t mla_layer_dhR(const ModelConfig& cfg, int64_t layer) {
  const bool last_in_block = (layer % cfg.layers_per_block) == cfg.layers_per_block - 1;
  return cfg.mla_last_layer_no_rope && last_in_block ? 0 : cfg.dhR;
}

}  // namespace meshtrain
