// The CUDA backend of the meshtrain operators: tensors in, the launchers of
// cuda_kernels.cu on the current stream, errors as exceptions. Compiled only
// where nvcc built those kernels (MESHTRAIN_CUDA_KERNELS, CMakeLists.txt).
#ifdef MESHTRAIN_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include "cuda_kernels.h"
#include "kernels.h"
#include "strided.h"
#include "meshtrain/core/check.h"

namespace meshtrain::ops::impl {

namespace {

cuda::Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return cuda::Dtype::F32;
    case at::kBFloat16:
      return cuda::Dtype::BF16;
    case at::kHalf:
      return cuda::Dtype::F16;
    default:
      MT_FAIL("meshtrain CUDA kernels take fp32, bf16 or fp16, got ", t.scalar_type());
  }
}

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

void check_launch(cudaError_t e, const char* what) {
  MT_CHECK(e == cudaSuccess, "CUDA kernel ", what, " failed: ", cudaGetErrorString(e));
}

const void* cptr(const Opt& t) { return t ? t->const_data_ptr() : nullptr; }
const float* fptr(const Opt& t) { return t ? t->const_data_ptr<float>() : nullptr; }

}  // namespace

at::Tensor& rope_out_cuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                          int64_t seq_dim, bool inverse, at::Tensor& out) {
  check_rope(x, cos, sin, offset, seq_dim, out);
  const c10::cuda::CUDAGuard guard(x.device());
  const rows::Strided s = strided_layout(x, out, seq_dim);
  vector_rope(x, out, cos, sin, seq_dim);  // noted: the launcher takes the same decision
  check_launch(cuda::rope(dtype_of(x), s, x.const_data_ptr(), out.data_ptr(), cos.const_data_ptr<float>(),
                          sin.const_data_ptr<float>(), offset, inverse, stream_of(x)),
               "rope");
  return out;
}

Norm rms_norm_fwd_cuda(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias, double eps) {
  check_norm(a, b, w, bias);
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t D = a.size(-1), N = a.numel() / D;
  at::Tensor h = b ? at::empty_like(a) : at::empty({0}, a.options());
  at::Tensor y = at::empty_like(a);
  std::vector<int64_t> rs = a.sizes().vec();
  rs.pop_back();
  at::Tensor rstd = at::empty(rs, a.options().dtype(at::kFloat));
  // Noted here; the launcher decides alike from the same pointers.
  vector_rows("rms_norm_fwd", a, D, D,
              {a.const_data_ptr(), cptr(b), b ? h.const_data_ptr() : nullptr, y.const_data_ptr(),
               w.const_data_ptr(), cptr(bias)});
  check_launch(cuda::rms_norm_fwd(dtype_of(a), a.const_data_ptr(), cptr(b), w.const_data_ptr<float>(), fptr(bias),
                                  b ? h.data_ptr() : nullptr, y.data_ptr(), rstd.data_ptr<float>(), N, D,
                                  static_cast<float>(eps), stream_of(a)),
               "rms_norm forward");
  return {h, y, rstd};
}

Norm rms_norm_bwd_cuda(const at::Tensor& dy, const at::Tensor& h, const at::Tensor& w, const at::Tensor& rstd,
                       const Opt& dres, bool bias) {
  MT_ASSERT(dy.is_contiguous() && h.is_contiguous() && dy.sizes() == h.sizes() && dy.scalar_type() == h.scalar_type(),
            "rms_norm backward: dy ", dy.sizes(), " and h ", h.sizes(), " must be contiguous and alike");
  MT_ASSERT(!dres || (dres->is_contiguous() && dres->sizes() == h.sizes() && dres->scalar_type() == h.scalar_type()),
            "rms_norm backward: the residual gradient differs from h");
  const c10::cuda::CUDAGuard guard(h.device());
  const int64_t D = h.size(-1), N = h.numel() / D;
  // Partial column sums per block: a few blocks per multiprocessor is plenty.
  const int blocks = static_cast<int>(std::clamp<int64_t>(N, 1, 1024));
  at::Tensor dh = at::empty_like(h);
  at::Tensor dw_part = at::zeros({blocks, D}, w.options());
  at::Tensor db_part = bias ? at::zeros({blocks, D}, w.options()) : at::Tensor();
  vector_rows("rms_norm_bwd", h, D, D,
              {dy.const_data_ptr(), h.const_data_ptr(), cptr(dres), dh.const_data_ptr(), w.const_data_ptr()});
  check_launch(cuda::rms_norm_bwd(dtype_of(h), dy.const_data_ptr(), h.const_data_ptr(), w.const_data_ptr<float>(),
                                  rstd.const_data_ptr<float>(), cptr(dres), dh.data_ptr(), dw_part.data_ptr<float>(),
                                  bias ? db_part.data_ptr<float>() : nullptr, N, D, blocks, stream_of(h)),
               "rms_norm backward");
  return {dh, dw_part.sum(0), bias ? db_part.sum(0) : at::empty({0}, w.options())};
}

at::Tensor cross_entropy_rows_cuda(at::Tensor& z, const at::Tensor& targets, bool grad) {
  check_rows(z, targets);
  const c10::cuda::CUDAGuard guard(z.device());
  at::Tensor loss = at::empty({z.size(0)}, z.options().dtype(at::kFloat));
  const at::Tensor t = targets.contiguous();
  vector_rows("cross_entropy_rows", z, z.size(1), z.stride(0), {z.const_data_ptr()});
  check_launch(cuda::cross_entropy_rows(dtype_of(z), z.data_ptr(), z.stride(0), z.size(0), z.size(1),
                                        t.const_data_ptr<int64_t>(), loss.data_ptr<float>(), grad, stream_of(z)),
               "cross_entropy_rows");
  return loss;
}

at::Tensor softmax_stats_cuda(const at::Tensor& z, const at::Tensor& targets, int64_t valid) {
  check_rows(z, targets, valid);
  const c10::cuda::CUDAGuard guard(z.device());
  at::Tensor out = at::empty({3, z.size(0)}, z.options().dtype(at::kFloat));
  const at::Tensor t = targets.contiguous();
  vector_rows("softmax_stats", z, z.size(1), z.stride(0), {z.const_data_ptr()});
  check_launch(cuda::softmax_stats(dtype_of(z), z.const_data_ptr(), z.stride(0), z.size(0), z.size(1), valid,
                                   t.const_data_ptr<int64_t>(), out.data_ptr<float>(), stream_of(z)),
               "softmax_stats");
  return out;
}

at::Tensor& softmax_grad_cuda(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, int64_t valid) {
  check_rows(z, targets, valid);
  const c10::cuda::CUDAGuard guard(z.device());
  const at::Tensor t = targets.contiguous(), l = lse.to(at::kFloat).contiguous();
  vector_rows("softmax_grad", z, z.size(1), z.stride(0), {z.const_data_ptr()});
  check_launch(cuda::softmax_grad(dtype_of(z), z.data_ptr(), z.stride(0), z.size(0), valid, z.size(1),
                                  t.const_data_ptr<int64_t>(), l.const_data_ptr<float>(), stream_of(z)),
               "softmax_grad");
  return z;
}

at::Tensor combine_rows_cuda(const at::Tensor& src, const at::Tensor& slot, const Opt& weight) {
  check_combine_rows(src, slot, weight);
  const c10::cuda::CUDAGuard guard(src.device());
  const int64_t N = slot.size(0), k = slot.size(1), d = src.size(1);
  at::Tensor out = at::empty({N, d}, src.options());
  vector_rows("combine_rows", src, d, d, {src.const_data_ptr(), out.const_data_ptr()});
  check_launch(cuda::combine_rows(dtype_of(src), src.const_data_ptr(), slot.const_data_ptr<int64_t>(), fptr(weight), k,
                                  out.data_ptr(), N, d, stream_of(src)),
               "combine_rows");
  return out;
}

Spread spread_rows_cuda(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y) {
  check_spread_rows(src, owner, k, weight, y);
  const c10::cuda::CUDAGuard guard(src.device());
  const int64_t R = owner.size(0), A = src.size(0) * k, d = src.size(1);
  const auto f32 = src.options().dtype(at::kFloat);
  at::Tensor out = at::empty({R, d}, src.options());
  at::Tensor dw = y ? at::zeros({A}, f32) : at::empty({0}, f32);
  vector_rows("spread_rows", src, d, d, {src.const_data_ptr(), cptr(y), out.const_data_ptr()});
  check_launch(cuda::spread_rows(dtype_of(src), src.const_data_ptr(), owner.const_data_ptr<int64_t>(), k, fptr(weight),
                                 cptr(y), out.data_ptr(), y ? dw.data_ptr<float>() : nullptr, R, d, stream_of(src)),
               "spread_rows");
  return {out, dw};
}

void adamw_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
                const at::Tensor& step, double lr, double beta1, double beta2, double weight_decay, double eps,
                const Opt& grad_scale, const Opt& found_inf, const Opt& lr_tensor, at::TensorList casts) {
  check_adamw(params, grads, exp_avg, exp_avg_sq, step, grad_scale, found_inf, casts, lr_tensor);
  if (params.empty()) return;
  const c10::cuda::CUDAGuard guard(params[0].device());
  for (const at::Tensor* t : {&step, grad_scale ? &*grad_scale : nullptr, found_inf ? &*found_inf : nullptr,
                              lr_tensor ? &*lr_tensor : nullptr})
    MT_ASSERT(!t || t->device() == params[0].device(), "adamw_: step, grad_scale, found_inf and lr_tensor must be on ",
              params[0].device());
  const size_t n = params.size();
  std::vector<float*> p(n);
  std::vector<const float*> g(n);
  std::vector<void*> m(n), v(n), c(casts.size());
  std::vector<int64_t> numel(n);
  for (size_t k = 0; k < n; ++k) {
    p[k] = params[k].data_ptr<float>();
    g[k] = grads[k].const_data_ptr<float>();
    m[k] = exp_avg[k].data_ptr();
    v[k] = exp_avg_sq[k].data_ptr();
    if (!casts.empty()) c[k] = casts[k].data_ptr();
    numel[k] = params[k].numel();
  }
  const adamw::Hyper h{static_cast<float>(lr), static_cast<float>(beta1), static_cast<float>(beta2),
                       static_cast<float>(weight_decay), static_cast<float>(eps)};
  check_launch(cuda::adamw(dtype_of(exp_avg[0]), static_cast<int64_t>(n), p.data(), g.data(), m.data(), v.data(),
                           c.empty() ? nullptr : c.data(), numel.data(), h, step.const_data_ptr<float>(), fptr(grad_scale), fptr(found_inf),
                           fptr(lr_tensor), stream_of(params[0])),
               "adamw_");
}

}  // namespace meshtrain::ops::impl
#endif  // MESHTRAIN_CUDA_KERNELS
