// Chunked cross-entropy (see cross_entropy.h).
#include "meshtrain/model/cross_entropy.h"

#include <torch/torch.h>

#include <algorithm>

#include "meshtrain/core/check.h"
#include "meshtrain/model/matmul_dtype.h"

namespace meshtrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w, const at::Tensor& t,
                            int64_t chunk) {
    const int64_t N = h.size(0);
    const bool grad = h.requires_grad() || w.requires_grad();
    at::Tensor losses = at::empty({N}, h.options().dtype(at::kFloat));
    at::Tensor dlogits;  // softmax - onehot, all chunks
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor z = mp_linear(h.narrow(0, s, n), w);  // [n, V], the matmul dtype
      const at::Tensor tc = t.narrow(0, s, n).unsqueeze(1);
      // fp32 accumulation (and output) for this chunk only.
      const at::Tensor logp = at::_log_softmax(z, 1, /*half_to_float=*/z.scalar_type() != at::kFloat);
      losses.narrow(0, s, n).copy_(logp.gather(1, tc).squeeze(1).neg());
      if (!grad) continue;
      if (!dlogits.defined()) dlogits = at::empty({N, z.size(1)}, z.options());
      at::Tensor d = dlogits.narrow(0, s, n);
      at::_softmax_out(d, z, 1, false);
      d.scatter_add_(1, tc, at::full({n, 1}, -1.0, d.options()));
    }
    if (grad) ctx->save_for_backward({h, w, dlogits});
    return losses;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &w = saved[1], &d = saved[2];
    const at::Tensor g = grads[0].unsqueeze(1);  // [N, 1] per-token upstream gradient
    const auto dt = d.scalar_type();
    const at::Tensor dh = (at::mm(d, w.to(dt)) * g).to(h.scalar_type());
    const at::Tensor dw = at::mm(d.t(), (h * g).to(dt)).to(w.scalar_type());
    return {dh, dw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_rows) {
  MT_ASSERT(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1), "cross-entropy: h ", h.sizes(),
            " and weight ", weight.sizes(), " do not match");
  MT_ASSERT(targets.numel() == h.size(0), "cross-entropy: ", targets.numel(), " targets for ", h.size(0), " rows");
  if (chunk_rows <= 0) chunk_rows = std::max<int64_t>(1, (int64_t{128} << 20) / std::max<int64_t>(1, weight.size(0)));
  return ChunkedCrossEntropy::apply(h, weight, targets.reshape({-1}).to(at::kLong), chunk_rows);
}

}  // namespace meshtrain
