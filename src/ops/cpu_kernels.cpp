// CPU kernels of the meshtrain operators: the row math of row_math.h, one
// row per iteration, rows spread over torch's intra-op threads.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "adamw_math.h"
#include "kernels.h"
#include "meshtrain/core/check.h"

#include "row_math.h"
#include "slot_math.h"
#include "strided.h"

namespace meshtrain::ops::rows {

template <>
struct Scalar<c10::BFloat16> {
  static float load(c10::BFloat16 v) { return static_cast<float>(v); }
  static c10::BFloat16 store(float v) { return c10::BFloat16(v); }
};
template <>
struct Scalar<c10::Half> {
  static float load(c10::Half v) { return static_cast<float>(v); }
  static c10::Half store(float v) { return c10::Half(v); }
};

}  // namespace meshtrain::ops::rows

namespace meshtrain::ops::impl {

namespace {

using rows::SerialLanes;

// Rows per task: enough work to be worth a thread.
int64_t grain(int64_t row_elements) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_elements)); }

}  // namespace

at::Tensor& rope_out_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                         int64_t seq_dim, bool inverse, at::Tensor& out) {
  check_rope(x, cos, sin, offset, seq_dim, out);
  const rows::Strided s = strided_layout(x, out, seq_dim);
  const int64_t n_rows = s.half > 0 ? rows::rope_pairs(s) / s.half : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rope_out_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const float *c = cos.const_data_ptr<float>(), *sn = sin.const_data_ptr<float>();
    // The CUDA kernel's path where it takes it (16-byte vectors), else pair by pair.
    const bool vec = vector_rope(x, out, cos, sin, seq_dim);
    at::parallel_for(0, n_rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.half)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        if (!vec) {
          rows::rope_row(s, r, xp, op, c, sn, offset, inverse);
          continue;
        }
        for (int64_t f = 0; f < s.half; f += rows::kVec<scalar_t>)
          rows::rope_vec_of_row(s, r, f, xp, op, c, sn, offset, inverse);
      }
    });
  });
  return out;
}

Norm rms_norm_fwd_cpu(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias, double eps) {
  check_norm(a, b, w, bias);
  const int64_t D = a.size(-1), N = a.numel() / D;
  at::Tensor h = b ? at::empty_like(a) : at::empty({0}, a.options());
  at::Tensor y = at::empty_like(a);
  std::vector<int64_t> rs = a.sizes().vec();
  rs.pop_back();
  at::Tensor rstd = at::empty(rs, a.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "rms_norm_fwd_cpu", [&] {
    const scalar_t* ap = a.const_data_ptr<scalar_t>();
    const scalar_t* bp = b ? b->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* hp = b ? h.data_ptr<scalar_t>() : nullptr;
    scalar_t* yp = y.data_ptr<scalar_t>();
    const float* wp = w.const_data_ptr<float>();
    const float* biasp = bias ? bias->const_data_ptr<float>() : nullptr;
    float* rp = rstd.data_ptr<float>();
    const auto run = [&](auto width) {
      constexpr int V = decltype(width)::value;
      at::parallel_for(0, N, grain(D), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          rp[r] = rows::rms_norm_row<V>(SerialLanes{}, ap + r * D, bp ? bp + r * D : nullptr, wp, biasp,
                                        hp ? hp + r * D : nullptr, yp + r * D, D, static_cast<float>(eps));
      });
    };
    rows::with_width<scalar_t>(vector_rows("rms_norm_fwd", a, D, D, {ap, bp, hp, yp, wp, biasp}), run);
  });
  return {h, y, rstd};
}

Norm rms_norm_bwd_cpu(const at::Tensor& dy, const at::Tensor& h, const at::Tensor& w, const at::Tensor& rstd,
                      const Opt& dres, bool bias) {
  TORCH_CHECK(dy.is_contiguous() && h.is_contiguous() && dy.sizes() == h.sizes(), "rms_norm_bwd: dy ", dy.sizes(),
              " and h ", h.sizes(), " must be contiguous and alike");
  const int64_t D = h.size(-1), N = h.numel() / D;
  at::Tensor dh = at::empty_like(h);
  // Per-task column sums, added up after: no two threads share an accumulator.
  const int64_t g = grain(D), tasks = (N + g - 1) / g;
  at::Tensor dw_part = at::zeros({std::max<int64_t>(tasks, 1), D}, w.options());
  at::Tensor db_part = bias ? at::zeros({std::max<int64_t>(tasks, 1), D}, w.options()) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, h.scalar_type(), "rms_norm_bwd_cpu", [&] {
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const scalar_t* hp = h.const_data_ptr<scalar_t>();
    const scalar_t* resp = dres ? dres->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* dhp = dh.data_ptr<scalar_t>();
    const float* wp = w.const_data_ptr<float>();
    const float* rp = rstd.const_data_ptr<float>();
    float* dwp = dw_part.data_ptr<float>();
    float* dbp = bias ? db_part.data_ptr<float>() : nullptr;
    const auto run = [&](auto width) {
      constexpr int V = decltype(width)::value;
      at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t r = t * g; r < std::min(N, (t + 1) * g); ++r)
            rows::rms_norm_backward_row<V>(SerialLanes{}, dyp + r * D, hp + r * D, wp, rp[r],
                                           resp ? resp + r * D : nullptr, dhp + r * D, dwp + t * D,
                                           dbp ? dbp + t * D : nullptr, D);
      });
    };
    rows::with_width<scalar_t>(vector_rows("rms_norm_bwd", h, D, D, {dyp, hp, resp, dhp, wp}), run);
  });
  return {dh, dw_part.sum(0), bias ? db_part.sum(0) : at::empty({0}, w.options())};
}

at::Tensor cross_entropy_rows_cpu(at::Tensor& z, const at::Tensor& targets, bool grad) {
  check_rows(z, targets);
  const int64_t N = z.size(0), V = z.size(1), ld = z.stride(0);
  at::Tensor loss = at::empty({N}, z.options().dtype(at::kFloat));
  const at::Tensor t = targets.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, z.scalar_type(), "cross_entropy_rows_cpu", [&] {
    scalar_t* zp = z.data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    float* lp = loss.data_ptr<float>();
    const auto run = [&](auto width) {
      constexpr int W = decltype(width)::value;
      at::parallel_for(0, N, grain(V), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          lp[r] = rows::cross_entropy_row<W>(SerialLanes{}, zp + r * ld, V, tp[r], grad);
      });
    };
    rows::with_width<scalar_t>(vector_rows("cross_entropy_rows", z, V, ld, {zp}), run);
  });
  return loss;
}

at::Tensor softmax_stats_cpu(const at::Tensor& z, const at::Tensor& targets, int64_t valid) {
  check_rows(z, targets, valid);
  const int64_t N = z.size(0), ld = z.stride(0);
  at::Tensor out = at::empty({3, N}, z.options().dtype(at::kFloat));
  const at::Tensor t = targets.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, z.scalar_type(), "softmax_stats_cpu", [&] {
    const scalar_t* zp = z.const_data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    float* op = out.data_ptr<float>();
    const auto run = [&](auto width) {
      constexpr int V = decltype(width)::value;
      at::parallel_for(0, N, grain(valid), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const rows::SoftmaxStats s = rows::softmax_stats_row<V>(SerialLanes{}, zp + r * ld, valid);
          op[r] = s.max;
          op[N + r] = s.sum;
          op[2 * N + r] = tp[r] >= 0 && tp[r] < valid ? rows::ld(zp[r * ld + tp[r]]) : 0.0f;
        }
      });
    };
    rows::with_width<scalar_t>(vector_rows("softmax_stats", z, z.size(1), ld, {zp}), run);
  });
  return out;
}

at::Tensor& softmax_grad_cpu(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, int64_t valid) {
  check_rows(z, targets, valid);
  const int64_t N = z.size(0), V = z.size(1), ld = z.stride(0);
  const at::Tensor t = targets.contiguous(), l = lse.to(at::kFloat).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, z.scalar_type(), "softmax_grad_cpu", [&] {
    scalar_t* zp = z.data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    const float* lp = l.const_data_ptr<float>();
    const auto run = [&](auto width) {
      constexpr int W = decltype(width)::value;
      at::parallel_for(0, N, grain(V), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) rows::softmax_grad_row<W>(SerialLanes{}, zp + r * ld, valid, V, tp[r], lp[r]);
      });
    };
    rows::with_width<scalar_t>(vector_rows("softmax_grad", z, V, ld, {zp}), run);
  });
  return z;
}

at::Tensor combine_rows_cpu(const at::Tensor& src, const at::Tensor& slot, const Opt& weight) {
  check_combine_rows(src, slot, weight);
  const int64_t N = slot.size(0), k = slot.size(1), R = src.size(0), d = src.size(1);
  const int64_t* sp = slot.const_data_ptr<int64_t>();
  for (int64_t a = 0; a < N * k; ++a)
    MT_ASSERT(sp[a] >= -1 && sp[a] < R, "combine_rows: assignment ", a, " names row ", sp[a], " of ", R);
  at::Tensor out = at::empty({N, d}, src.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, src.scalar_type(), "combine_rows_cpu", [&] {
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    const float* w = weight ? weight->const_data_ptr<float>() : nullptr;
    const auto run = [&](auto width) {
      constexpr int V = decltype(width)::value;
      at::parallel_for(0, N, grain(k * d), [&](int64_t b, int64_t e) {
        for (int64_t n = b; n < e; ++n)
          rows::combine_row<V>(SerialLanes{}, s, sp + n * k, w ? w + n * k : nullptr, k, o + n * d, d);
      });
    };
    rows::with_width<scalar_t>(vector_rows("combine_rows", src, d, d, {s, o}), run);
  });
  return out;
}

Spread spread_rows_cpu(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y) {
  check_spread_rows(src, owner, k, weight, y);
  const int64_t R = owner.size(0), A = src.size(0) * k, d = src.size(1);
  const int64_t* op = owner.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    MT_ASSERT(op[r] >= -1 && op[r] < A, "spread_rows: row ", r, " names assignment ", op[r], " of ", A);
  at::Tensor out = at::empty({R, d}, src.options());
  // Assignments without a row keep a zero gradient.
  at::Tensor dw = y ? at::zeros({A}, src.options().dtype(at::kFloat)) : at::empty({0}, src.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, src.scalar_type(), "spread_rows_cpu", [&] {
    const scalar_t* s = src.const_data_ptr<scalar_t>();
    const scalar_t* yp = y ? y->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* o = out.data_ptr<scalar_t>();
    const float* w = weight ? weight->const_data_ptr<float>() : nullptr;
    float* dwp = y ? dw.data_ptr<float>() : nullptr;
    const auto run = [&](auto width) {
      constexpr int V = decltype(width)::value;
      // Each assignment is held by one row at most: its gradient has one writer.
      at::parallel_for(0, R, grain(d), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float g = rows::spread_row<V>(SerialLanes{}, s, op[r], k, w, yp ? yp + r * d : nullptr, o + r * d, d);
          if (dwp && op[r] >= 0) dwp[op[r]] = g;
        }
      });
    };
    rows::with_width<scalar_t>(vector_rows("spread_rows", src, d, d, {s, yp, o}), run);
  });
  return {out, dw};
}

void adamw_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
               const at::Tensor& step, double lr, double beta1, double beta2, double weight_decay, double eps,
               const Opt& grad_scale, const Opt& found_inf, const Opt& lr_tensor, at::TensorList casts) {
  check_adamw(params, grads, exp_avg, exp_avg_sq, step, grad_scale, found_inf, casts, lr_tensor);
  if (params.empty() || (found_inf && found_inf->item<float>() != 0.0f)) return;
  if (lr_tensor) lr = lr_tensor->item<float>();  // read as the CUDA kernel reads it: one fp32
  const adamw::Hyper h{static_cast<float>(lr), static_cast<float>(beta1), static_cast<float>(beta2),
                       static_cast<float>(weight_decay), static_cast<float>(eps)};
  const adamw::StepConsts c = adamw::step_consts(h, step.item<float>());
  const float scale = grad_scale ? grad_scale->item<float>() : 1.0f;
  const float* scale_p = grad_scale ? &scale : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, exp_avg[0].scalar_type(), "adamw_cpu", [&] {
    for (size_t k = 0; k < params.size(); ++k) {
      float* p = params[k].data_ptr<float>();
      const float* g = grads[k].const_data_ptr<float>();
      scalar_t* m = exp_avg[k].data_ptr<scalar_t>();
      scalar_t* v = exp_avg_sq[k].data_ptr<scalar_t>();
      c10::BFloat16* out = casts.empty() ? nullptr : casts[k].data_ptr<c10::BFloat16>();
      at::parallel_for(0, params[k].numel(), 32768, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) adamw::element(p[i], g[i], m[i], v[i], c, scale_p, out ? out + i : nullptr);
      });
    }
  });
}

}  // namespace meshtrain::ops::impl
