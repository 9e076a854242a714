// The meshtrain operators (see ops/fused.h): schemas, the per-backend
// registrations, the meta kernels and the autograd functions over them.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/strides.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels.h"
#include "meshtrain/core/check.h"
#include "meshtrain/ops/fused.h"

namespace meshtrain::ops {

namespace {

using impl::Opt;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- meta kernels: shapes only (the performance model) ----------------------
at::Tensor& rope_out_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                          int64_t seq_dim, bool, at::Tensor& out) {
  impl::check_rope(x, cos, sin, offset, seq_dim, out);
  return out;
}

std::vector<int64_t> row_shape(const at::Tensor& x) {
  std::vector<int64_t> s = x.sizes().vec();
  s.pop_back();
  return s;
}

impl::Norm rms_norm_fwd_meta(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias, double) {
  impl::check_norm(a, b, w, bias);
  const at::Tensor h = b ? at::empty_like(a) : at::empty({0}, a.options());
  return {h, at::empty_like(a), at::empty(row_shape(a), a.options().dtype(at::kFloat))};
}

impl::Norm rms_norm_bwd_meta(const at::Tensor& dy, const at::Tensor& h, const at::Tensor& w, const at::Tensor&,
                             const Opt&, bool bias) {
  return {at::empty_like(h), at::empty_like(w), bias ? at::empty_like(w) : at::empty({0}, w.options())};
}

at::Tensor cross_entropy_rows_meta(at::Tensor& z, const at::Tensor& targets, bool) {
  impl::check_rows(z, targets);
  return at::empty({z.size(0)}, z.options().dtype(at::kFloat));
}

at::Tensor softmax_stats_meta(const at::Tensor& z, const at::Tensor& targets, int64_t valid) {
  impl::check_rows(z, targets, valid);
  return at::empty({3, z.size(0)}, z.options().dtype(at::kFloat));
}

at::Tensor& softmax_grad_meta(at::Tensor& z, const at::Tensor& targets, const at::Tensor&, int64_t valid) {
  impl::check_rows(z, targets, valid);
  return z;
}

// ---- calls through the dispatcher (what the observer sees) -----------------
const c10::TypedOperatorHandle<at::Tensor&(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                           int64_t, bool, at::Tensor&)>&
rope_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::rope_out", "")
                             .typed<at::Tensor&(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                                int64_t, bool, at::Tensor&)>();
  return op;
}

at::Tensor& call_rope(const at::Tensor& x, const RopeTables& t, int64_t offset, int64_t seq_dim, bool inverse,
                      at::Tensor& out) {
  return rope_op().call(x, t.cos, t.sin, offset, seq_dim, inverse, out);
}

impl::Norm call_norm_fwd(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias, double eps) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::rms_norm_fwd", "")
                             .typed<impl::Norm(const at::Tensor&, const Opt&, const at::Tensor&, const Opt&, double)>();
  return op.call(a, b, w, bias, eps);
}

impl::Norm call_norm_bwd(const at::Tensor& dy, const at::Tensor& h, const at::Tensor& w, const at::Tensor& rstd,
                         const Opt& dres, bool bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::rms_norm_bwd", "")
                             .typed<impl::Norm(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const Opt&, bool)>();
  return op.call(dy, h, w, rstd, dres, bias);
}

// Kernels read the last dim with stride 1.
at::Tensor unit_last(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }
Opt opt(const at::Tensor& t) { return t.defined() ? Opt(t) : std::nullopt; }

// ---- autograd ----------------------------------------------------------------
// The layout of a rotation's input, for its gradient: written in x's own
// memory order (e.g. heads split off a [B, T, H * dim] GEMM output and
// transposed), the gradient reaches that GEMM as a view, not through a
// transposing copy. Inputs with gaps or overlaps get a contiguous gradient.
void save_layout(AutogradContext* ctx, const at::Tensor& x) {
  ctx->saved_data["sizes"] = x.sizes().vec();
  const c10::DimVector dense = c10::contiguous_strides(x.sizes());
  ctx->saved_data["strides"] =
      x.is_non_overlapping_and_dense() ? x.strides().vec() : std::vector<int64_t>(dense.begin(), dense.end());
}

at::Tensor empty_in_layout(AutogradContext* ctx, const at::TensorOptions& options) {
  return at::empty_strided(ctx->saved_data["sizes"].toIntVector(), ctx->saved_data["strides"].toIntVector(), options);
}

class RopeFn : public torch::autograd::Function<RopeFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t offset, int64_t seq_dim) {
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["seq_dim"] = seq_dim;
    ctx->save_for_backward({cos, sin});
    save_layout(ctx, x);
    at::Tensor out = at::empty(x.sizes(), x.options());
    return call_rope(unit_last(x), {cos, sin}, offset, seq_dim, false, out);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor g = unit_last(grads[0]);
    at::Tensor dx = empty_in_layout(ctx, g.options());
    call_rope(g, {saved[0], saved[1]}, ctx->saved_data["offset"].toInt(), ctx->saved_data["seq_dim"].toInt(), true,
              dx);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// cat({head, rope(x)}, -1): head copied and x rotated straight into the two
// column ranges of one buffer; backward: head's gradient is the first
// range's view, x's the second range rotated back (in x's layout).
class RopeConcatFn : public torch::autograd::Function<RopeConcatFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& head, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t offset, int64_t seq_dim) {
    const int64_t h = head.size(-1), r = x.size(-1);
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["seq_dim"] = seq_dim;
    ctx->saved_data["head"] = h;
    ctx->save_for_backward({cos, sin});
    save_layout(ctx, x);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = h + r;
    at::Tensor out = at::empty(shape, x.options());
    out.narrow(-1, 0, h).copy_(head);
    at::Tensor tail = out.narrow(-1, h, r);
    call_rope(unit_last(x), {cos, sin}, offset, seq_dim, false, tail);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    const int64_t h = ctx->saved_data["head"].toInt();
    at::Tensor dx = empty_in_layout(ctx, g.options());
    call_rope(unit_last(g.narrow(-1, h, g.size(-1) - h)), {saved[0], saved[1]}, ctx->saved_data["offset"].toInt(),
              ctx->saved_data["seq_dim"].toInt(), true, dx);
    return {g.narrow(-1, 0, h), dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class QkvRopeFn : public torch::autograd::Function<QkvRopeFn> {
 public:
  // qkv [B, T, 3, H, hd] -> q, k (rotated, one buffer) and v (qkv's own slice).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& cos,
                               const at::Tensor& sin, int64_t offset) {
    ctx->saved_data["offset"] = offset;
    ctx->save_for_backward({cos, sin});
    at::Tensor qk = at::empty({qkv.size(0), qkv.size(1), 2, qkv.size(3), qkv.size(4)}, qkv.options());
    call_rope(qkv.narrow(2, 0, 2), {cos, sin}, offset, 1, false, qk);
    return {qk.select(2, 0).transpose(1, 2), qk.select(2, 1).transpose(1, 2), qkv.select(2, 2).transpose(1, 2)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t offset = ctx->saved_data["offset"].toInt();
    const at::Tensor& ref = grads[0].defined() ? grads[0] : grads[1].defined() ? grads[1] : grads[2];
    MT_ASSERT(ref.defined(), "qkv_rope backward without any gradient");
    const int64_t B = ref.size(0), H = ref.size(1), T = ref.size(2), hd = ref.size(3);
    at::Tensor dqkv = at::empty({B, T, 3, H, hd}, ref.options());
    for (int i = 0; i < 2; ++i) {
      at::Tensor out = dqkv.select(2, i);
      if (!grads[i].defined()) {
        out.zero_();
        continue;
      }
      call_rope(unit_last(grads[i].transpose(1, 2)), {saved[0], saved[1]}, offset, 1, true, out);
    }
    if (grads[2].defined()) {
      dqkv.select(2, 2).copy_(grads[2].transpose(1, 2));
    } else {
      dqkv.select(2, 2).zero_();
    }
    return {dqkv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class RmsNormFn : public torch::autograd::Function<RmsNormFn> {
 public:
  // The bias is optional (an undefined tensor is not a valid autograd input).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const Opt& bias,
                            double eps) {
    auto [h, y, rstd] = call_norm_fwd(x, std::nullopt, w, bias, eps);
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["bias"] = bias.has_value();
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const bool bias = ctx->saved_data["bias"].toBool();
    auto [dx, dw, db] = call_norm_bwd(unit_last(grads[0]).contiguous(), s[0], s[1], s[2], std::nullopt, bias);
    return {dx, dw, bias ? db : at::Tensor(), at::Tensor()};
  }
};

class AddRmsNormFn : public torch::autograd::Function<AddRmsNormFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, const at::Tensor& w,
                               const Opt& bias, double eps) {
    auto [h, y, rstd] = call_norm_fwd(a, b, w, bias, eps);
    ctx->save_for_backward({h, w, rstd});
    ctx->saved_data["bias"] = bias.has_value();
    return {h, y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const bool bias = ctx->saved_data["bias"].toBool();
    const at::Tensor& dh = grads[0];
    if (!grads[1].defined()) return {dh, dh, at::Tensor(), at::Tensor(), at::Tensor()};
    auto [dsum, dw, db] = call_norm_bwd(grads[1].contiguous(), s[0], s[1], s[2],
                                        dh.defined() ? Opt(dh.contiguous()) : std::nullopt, bias);
    // Both summands of h get d(h) whole.
    return {dsum, dsum, dw, bias ? db : at::Tensor(), at::Tensor()};
  }
};

// The norm of a residual stream that also flows on: returns (x, norm(x)) so
// that x's gradient from its other consumer reaches this backward, which
// sums it in the norm's kernel instead of autograd adding two full tensors.
class ResidualRmsNormFn : public torch::autograd::Function<ResidualRmsNormFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const Opt& bias,
                               double eps) {
    auto [h, y, rstd] = call_norm_fwd(x, std::nullopt, w, bias, eps);
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["bias"] = bias.has_value();
    return {x, y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const bool bias = ctx->saved_data["bias"].toBool();
    const at::Tensor& dx = grads[0];
    if (!grads[1].defined()) return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
    auto [dsum, dw, db] = call_norm_bwd(grads[1].contiguous(), s[0], s[1], s[2],
                                        dx.defined() ? Opt(dx.contiguous()) : std::nullopt, bias);
    return {dsum, dw, bias ? db : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

RopeTables rope_tables(int64_t dim, int64_t positions, double theta, const at::Device& device) {
  MT_CHECK(dim % 2 == 0, "rope needs an even number of dims, got ", dim, " (hint: head_dim and dhR must be even)");
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const auto inv_freq = at::pow(theta, -at::arange(0, dim, 2, f32) / static_cast<double>(dim));  // [dim/2]
  const auto angle = at::outer(at::arange(0, positions, f32), inv_freq);                        // [n, dim/2]
  return {angle.cos().to(device), angle.sin().to(device)};
}

at::Tensor rope(const at::Tensor& x, const RopeTables& t, int64_t offset, int64_t seq_dim) {
  if (seq_dim < 0) seq_dim += x.dim();
  return RopeFn::apply(x, t.cos, t.sin, offset, seq_dim);
}

at::Tensor rope_concat(const at::Tensor& head, const at::Tensor& x, const RopeTables& t, int64_t offset,
                       int64_t seq_dim) {
  if (seq_dim < 0) seq_dim += x.dim();
  std::vector<int64_t> lead = x.sizes().vec(), head_lead = head.sizes().vec();
  lead.pop_back();
  head_lead.pop_back();
  MT_ASSERT(lead == head_lead && head.scalar_type() == x.scalar_type(), "rope_concat: head ", head.sizes(), " ",
            head.scalar_type(), " and x ", x.sizes(), " ", x.scalar_type(), " differ before the last dim");
  return RopeConcatFn::apply(head, x, t.cos, t.sin, offset, seq_dim);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rope(const at::Tensor& qkv, const RopeTables& t, int64_t offset) {
  MT_ASSERT(qkv.dim() == 5 && qkv.size(2) == 3, "qkv_rope wants [B, T, 3, H, hd], got ", qkv.sizes());
  const auto out = QkvRopeFn::apply(unit_last(qkv), t.cos, t.sin, offset);
  return {out[0], out[1], out[2]};
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, double eps) {
  return RmsNormFn::apply(unit_last(x).contiguous(), w, opt(bias), eps);
}

std::pair<at::Tensor, at::Tensor> residual_rms_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                                                    double eps) {
  const auto out = ResidualRmsNormFn::apply(unit_last(x).contiguous(), w, opt(bias), eps);
  return {out[0], out[1]};
}

std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& w,
                                               const at::Tensor& bias, double eps) {
  MT_ASSERT(a.sizes() == b.sizes(), "add_rms_norm: a ", a.sizes(), " and b ", b.sizes(), " differ");
  // The sum's dtype as `a + b` would have it (the residual stream's).
  const auto dt = at::result_type(a, b);
  const auto out = AddRmsNormFn::apply(a.to(dt).contiguous(), b.to(dt).contiguous(), w, opt(bias), eps);
  return {out[0], out[1]};
}

at::Tensor cross_entropy_rows_(at::Tensor& z, const at::Tensor& targets, bool grad) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("meshtrain::cross_entropy_rows_", "")
          .typed<at::Tensor(at::Tensor&, const at::Tensor&, bool)>();
  return op.call(z, targets, grad);
}

at::Tensor softmax_stats(const at::Tensor& z, const at::Tensor& targets, int64_t valid) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::softmax_stats", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(z, targets, valid);
}

void softmax_grad_(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, int64_t valid) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("meshtrain::softmax_grad_", "")
          .typed<at::Tensor&(at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t)>();
  op.call(z, targets, lse, valid);
}

bool have_cuda_kernels() {
#ifdef MESHTRAIN_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

// Out arguments are keyword-only: the operator observer counts them as
// written, not read (other mutable arguments as read and written).
TORCH_LIBRARY(meshtrain, m) {
  m.def("rope_out(Tensor x, Tensor cos, Tensor sin, int offset, int seq_dim, bool inverse, *, Tensor(a!) out) -> "
        "Tensor(a!)");
  m.def("rms_norm_fwd(Tensor a, Tensor? b, Tensor w, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("rms_norm_bwd(Tensor dy, Tensor h, Tensor w, Tensor rstd, Tensor? dres, bool bias) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("cross_entropy_rows_(Tensor(a!) z, Tensor targets, bool grad) -> Tensor");
  m.def("softmax_stats(Tensor z, Tensor targets, int valid) -> Tensor");
  m.def("softmax_grad_(Tensor(a!) z, Tensor targets, Tensor lse, int valid) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(meshtrain, CPU, m) {
  m.impl("rope_out", TORCH_FN(impl::rope_out_cpu));
  m.impl("rms_norm_fwd", TORCH_FN(impl::rms_norm_fwd_cpu));
  m.impl("rms_norm_bwd", TORCH_FN(impl::rms_norm_bwd_cpu));
  m.impl("cross_entropy_rows_", TORCH_FN(impl::cross_entropy_rows_cpu));
  m.impl("softmax_stats", TORCH_FN(impl::softmax_stats_cpu));
  m.impl("softmax_grad_", TORCH_FN(impl::softmax_grad_cpu));
}

TORCH_LIBRARY_IMPL(meshtrain, Meta, m) {
  m.impl("rope_out", TORCH_FN(rope_out_meta));
  m.impl("rms_norm_fwd", TORCH_FN(rms_norm_fwd_meta));
  m.impl("rms_norm_bwd", TORCH_FN(rms_norm_bwd_meta));
  m.impl("cross_entropy_rows_", TORCH_FN(cross_entropy_rows_meta));
  m.impl("softmax_stats", TORCH_FN(softmax_stats_meta));
  m.impl("softmax_grad_", TORCH_FN(softmax_grad_meta));
}

// CUDA: the kernels of cuda_kernels.cu, or without nvcc the aten composites.
#ifdef MESHTRAIN_CUDA_KERNELS
TORCH_LIBRARY_IMPL(meshtrain, CUDA, m) {
  m.impl("rope_out", TORCH_FN(impl::rope_out_cuda));
  m.impl("rms_norm_fwd", TORCH_FN(impl::rms_norm_fwd_cuda));
  m.impl("rms_norm_bwd", TORCH_FN(impl::rms_norm_bwd_cuda));
  m.impl("cross_entropy_rows_", TORCH_FN(impl::cross_entropy_rows_cuda));
  m.impl("softmax_stats", TORCH_FN(impl::softmax_stats_cuda));
  m.impl("softmax_grad_", TORCH_FN(impl::softmax_grad_cuda));
}
#else
TORCH_LIBRARY_IMPL(meshtrain, CUDA, m) {
  m.impl("rope_out", TORCH_FN(impl::rope_out_ref));
  m.impl("rms_norm_fwd", TORCH_FN(impl::rms_norm_fwd_ref));
  m.impl("rms_norm_bwd", TORCH_FN(impl::rms_norm_bwd_ref));
  m.impl("cross_entropy_rows_", TORCH_FN(impl::cross_entropy_rows_ref));
  m.impl("softmax_stats", TORCH_FN(impl::softmax_stats_ref));
  m.impl("softmax_grad_", TORCH_FN(impl::softmax_grad_ref));
}
#endif

}  // namespace meshtrain::ops
