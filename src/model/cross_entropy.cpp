// Chunked cross-entropy (see cross_entropy.h).
#include "meshtrain/model/cross_entropy.h"

#include <torch/torch.h>

#include <algorithm>

#include "meshtrain/core/check.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/ops/fused.h"

namespace meshtrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w, const at::Tensor& t,
                            int64_t chunk, int64_t precision, int64_t tied) {
    const int64_t N = h.size(0), V = w.size(0), Vp = padded_vocab(V);
    const bool grad = h.requires_grad() || w.requires_grad();
    // The cast (padded) weight is the one every other use of w this round
    // shares (a tied embedding's lookup).
    auto* p = reinterpret_cast<MixedPrecision*>(precision);
    const at::Tensor hc = p ? p->operand(h) : h;
    const at::Tensor wc = p ? p->operand_detached(w, Vp) : Vp == V ? w : at::constant_pad_nd(w, {0, 0, 0, Vp - V});
    at::Tensor losses = at::empty({N}, h.options().dtype(at::kFloat));
    // Training keeps every row's gradient for the backward; evaluation
    // reuses one chunk's buffer. Padded columns hold logit 0 (zero rows of
    // wc); the kernel reads only the first V, and their gradient stays 0.
    at::Tensor buf = at::empty({grad ? N : std::min(chunk, N), Vp}, hc.options());
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      at::Tensor z = buf.narrow(0, grad ? s : 0, n);
      at::mm_out(z, hc.narrow(0, s, n), wc.t());
      at::Tensor real = z.narrow(1, 0, V);
      losses.narrow(0, s, n).copy_(ops::cross_entropy_rows_(real, t.narrow(0, s, n), grad));
    }
    if (grad) {
      ctx->save_for_backward({hc, wc, buf});
      ctx->saved_data["h_dtype"] = h.scalar_type();
      ctx->saved_data["w_dtype"] = w.scalar_type();
      ctx->saved_data["vocab"] = V;
      ctx->saved_data["tied"] = tied;
    }
    return losses;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &w = saved[1], &d = saved[2];
    const int64_t V = ctx->saved_data["vocab"].toInt();
    const at::Tensor g = grads[0].unsqueeze(1).to(d.scalar_type());  // [N, 1] per-token upstream gradient
    const at::Tensor dh = (at::mm(d, w) * g).to(ctx->saved_data["h_dtype"].toScalarType());
    // Padded rows: dropped (the parameter has V rows).
    const at::Tensor dw = weight_grad(d, h * g, ctx->saved_data["w_dtype"].toScalarType()).narrow(0, 0, V);
    if (auto* tied = reinterpret_cast<TiedGrad*>(ctx->saved_data["tied"].toInt())) {
      // The embedding's backward, later in this pass, adds its rows and returns the sum.
      std::lock_guard<std::mutex> lock(tied->mu);
      tied->head = tied->head.defined() ? tied->head + dw : dw;
      return {dh, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    return {dh, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t padded_vocab(int64_t vocab) { return (vocab + 127) / 128 * 128; }

at::Tensor chunked_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_rows, MixedPrecision* precision, TiedGrad* tied) {
  MT_ASSERT(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1), "cross-entropy: h ", h.sizes(),
            " and weight ", weight.sizes(), " do not match");
  MT_ASSERT(targets.numel() == h.size(0), "cross-entropy: ", targets.numel(), " targets for ", h.size(0), " rows");
  if (chunk_rows <= 0) chunk_rows = std::max<int64_t>(1, (int64_t{128} << 20) / std::max<int64_t>(1, weight.size(0)));
  return ChunkedCrossEntropy::apply(h, weight, targets.reshape({-1}).to(at::kLong), chunk_rows,
                                    reinterpret_cast<int64_t>(precision), reinterpret_cast<int64_t>(tied));
}

}  // namespace meshtrain
