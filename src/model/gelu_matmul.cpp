// The GELU MLP's GEMMs as autograd functions (see gelu_matmul.h).
#include "meshtrain/model/gelu_matmul.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/ops/gelu_gemm.h"

namespace meshtrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Opt = std::optional<at::Tensor>;

// Rows of an unbatched operand flattened: [.., n] -> [rows, n].
at::Tensor rows_of(const at::Tensor& t, bool batched) { return batched ? t : t.reshape({-1, t.size(-1)}); }

std::vector<int64_t> with_last(at::IntArrayRef sizes, int64_t last) {
  std::vector<int64_t> s = sizes.vec();
  s.back() = last;
  return s;
}

// (pre, h) from x; backward: d(pre) -> dx, dw, d(bias).
class LinearGeluFn : public torch::autograd::Function<LinearGeluFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const Opt& bias,
                               int64_t precision) {
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    const bool batched = w.dim() == 3;
    const at::Tensor xc = mp.operand(x), wc = mp.operand_detached(w);
    auto [pre, h] = ops::linear_gelu(rows_of(xc, batched).contiguous(), wc,
                                     bias ? Opt(mp.operand_detached(*bias)) : std::nullopt);
    const auto shape = with_last(x.sizes(), w.size(-2));
    pre = pre.view(shape);
    h = h.view(shape);
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["w"] = w;  // the parameter: its gradient may be accumulated in the GEMM
    ctx->saved_data["b_dtype"] = bias ? bias->scalar_type() : w.scalar_type();
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["precision"] = precision;
    ctx->mark_non_differentiable({h});
    // h never gets a gradient: not a zero-filled one either (a [tokens, hidden] memset).
    ctx->set_materialize_grads(false);
    return {pre, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const bool batched = w.dim() == 3;
    const at::Tensor g = grads[0].to(x.scalar_type());
    const at::Tensor g2 = rows_of(g, batched);
    variable_list out(4);
    if (ctx->needs_input_grad(0))
      out[0] = (batched ? at::bmm(g2, w) : at::mm(g2, w)).view(x.sizes()).to(ctx->saved_data["x_dtype"].toScalarType());
    if (ctx->needs_input_grad(1))
      out[1] = param_weight_grad(ctx->saved_data["w"].toTensor(), g, x, batched,
                                 reinterpret_cast<MixedPrecision*>(ctx->saved_data["precision"].toInt()));
    // (needs_input_grad counts only the inputs that are tensors: not an absent bias.)
    if (ctx->saved_data["bias"].toBool())
      out[2] = at::sum(g2, {batched ? 1 : 0}, false, ctx->saved_data["b_dtype"].toScalarType());
    return out;
  }
};

// h w^T (+ bias or residual); backward: dy -> d(pre) through the DGELU
// epilogue, dw from h, d(bias), d(residual).
class GeluLinearFn : public torch::autograd::Function<GeluLinearFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& pre, const at::Tensor& h, const at::Tensor& w,
                            const Opt& bias, const Opt& residual, int64_t precision) {
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    const bool batched = w.dim() == 3;
    const at::Tensor wc = mp.operand_detached(w);
    ctx->save_for_backward({pre, h, wc});
    ctx->saved_data["w"] = w;  // the parameter: its gradient may be accumulated in the GEMM
    ctx->saved_data["b_dtype"] = bias ? bias->scalar_type() : w.scalar_type();
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["residual"] = residual.has_value();
    ctx->saved_data["precision"] = precision;
    if (batched) return at::bmm(h, wc.transpose(1, 2));
    if (residual) {
      at::Tensor y = at::empty_like(*residual);  // this function's own output, not a view of the GEMM's
      at::Tensor y2 = y.view({-1, wc.size(0)});
      at::addmm_out(y2, residual->view({-1, wc.size(0)}), h.reshape({-1, h.size(-1)}), wc.t());
      return y;
    }
    return bias ? at::linear(h, wc, mp.operand_detached(*bias)) : at::linear(h, wc);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &pre = saved[0], &h = saved[1], &w = saved[2];
    const bool batched = w.dim() == 3;
    const at::Tensor g = grads[0].to(h.scalar_type());
    const at::Tensor g2 = rows_of(g, batched).contiguous();
    variable_list out(6);
    if (ctx->needs_input_grad(0)) out[0] = ops::linear_dgelu(g2, w, rows_of(pre, batched)).view(pre.sizes());
    if (ctx->needs_input_grad(2))
      out[2] = param_weight_grad(ctx->saved_data["w"].toTensor(), g, h, batched,
                                 reinterpret_cast<MixedPrecision*>(ctx->saved_data["precision"].toInt()));
    if (ctx->saved_data["bias"].toBool()) out[3] = at::sum(g2, {0}, false, ctx->saved_data["b_dtype"].toScalarType());
    if (ctx->saved_data["residual"].toBool()) out[4] = grads[0];
    return out;
  }
};

}  // namespace

GeluPre linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, MixedPrecision& precision) {
  const bool batched = w.dim() == 3;
  MT_ASSERT((w.dim() == 2 || (batched && x.dim() == 3 && x.size(0) == w.size(0))) && x.size(-1) == w.size(-1) &&
                (!bias.defined() || bias.sizes() == w.sizes().slice(0, w.dim() - 1)),
            "linear_gelu: x ", x.sizes(), ", w ", w.sizes(), " and bias ", bias.defined() ? bias.sizes() : at::IntArrayRef{},
            " do not match");
  const Opt b = bias.defined() ? Opt(bias) : std::nullopt;
  if (!at::GradMode::is_enabled()) {
    // Nothing takes a gradient: the forward alone, without pre.
    const at::Tensor xc = precision.operand(x);
    auto [pre, h] = ops::linear_gelu(rows_of(xc, batched).contiguous(), precision.operand_detached(w),
                                     b ? Opt(precision.operand_detached(*b)) : std::nullopt);
    return {at::Tensor(), h.view(with_last(x.sizes(), w.size(-2)))};
  }
  const variable_list out = LinearGeluFn::apply(x, w, b, reinterpret_cast<int64_t>(&precision));
  return {out[0], out[1]};
}

at::Tensor gelu_linear(const GeluPre& a, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual,
                       MixedPrecision& precision) {
  const bool batched = w.dim() == 3;
  MT_ASSERT(a.h.defined() && a.h.size(-1) == w.size(-1) && (!batched || (a.h.dim() == 3 && a.h.size(0) == w.size(0))) &&
                !(batched && (bias.defined() || residual.defined())) && !(bias.defined() && residual.defined()),
            "gelu_linear: h ", a.h.defined() ? a.h.sizes() : at::IntArrayRef{}, " and w ", w.sizes(),
            bias.defined() ? " with a bias" : "", residual.defined() ? " with a residual" : "");
  if (!a.pre.defined()) {
    // Inference: a plain GEMM of h.
    if (batched) return batched_linear(a.h, w, precision);
    return bias.defined() ? precision.fused_linear(a.h, w, bias) : precision.fused_linear(a.h, w, {}, residual);
  }
  return GeluLinearFn::apply(a.pre, a.h, w, bias.defined() ? Opt(bias) : std::nullopt,
                             residual.defined() ? Opt(residual) : std::nullopt, reinterpret_cast<int64_t>(&precision));
}

}  // namespace meshtrain
