// Meta kernels for CUDA-only ops (see meta_kernels.h). Each returns empty
// tensors of the shapes, dtypes and layouts the CUDA kernel returns.
#include "meshtrain/perf/meta_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <mutex>

namespace meshtrain {

namespace {

using Tensor = at::Tensor;

// Flash attention writes its output as [B, T, H, D] and returns the
// [B, H, T, D] view, so the usual transpose back to tokens is free.
Tensor attention_output(const Tensor& q, const Tensor& v) {
  return at::empty({q.size(0), q.size(2), q.size(1), v.size(3)}, q.options()).transpose(1, 2);
}

Tensor lse(const Tensor& q) { return at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat)); }

std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor> flash_forward(
    const Tensor& q, const Tensor& k, const Tensor& v, double, bool, bool, std::optional<double>) {
  const auto rng = at::empty({2}, q.options().dtype(at::kLong));
  return {attention_output(q, v), lse(q), Tensor(), Tensor(), c10::SymInt(q.size(2)), c10::SymInt(k.size(2)), rng,
          at::empty({}, q.options().dtype(at::kLong)), at::empty({0}, q.options())};
}

std::tuple<Tensor, Tensor, Tensor> flash_backward(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                  c10::SymInt, c10::SymInt, double, bool, const Tensor&, const Tensor&,
                                                  std::optional<double>) {
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_forward(const Tensor& q, const Tensor&, const Tensor& v,
                                                             const std::optional<Tensor>&, bool, double, bool,
                                                             std::optional<double>) {
  const auto seed = at::empty({}, q.options().dtype(at::kLong));
  return {attention_output(q, v), lse(q), seed, at::empty({}, q.options().dtype(at::kLong))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_backward(const Tensor&, const Tensor& q, const Tensor& k,
                                                              const Tensor& v, const Tensor& bias, const Tensor&,
                                                              const Tensor&, const Tensor&, const Tensor&, double,
                                                              std::array<bool, 4> mask, bool, std::optional<double>) {
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v),
          mask[3] && bias.defined() ? at::empty_like(bias) : Tensor()};
}

// What CUDA's scaled_dot_product_attention picks for these inputs: flash
// when it can, memory-efficient attention otherwise (never the math path).
Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask, double dropout,
            bool causal, std::optional<double> scale, bool enable_gqa) {
  TORCH_CHECK(!enable_gqa, "meta sdpa: enable_gqa is not modelled");
  const int64_t d = q.size(-1);
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  const bool flash = half && !(mask && mask->defined()) && k.size(-1) == d && v.size(-1) == d && d <= 256 &&
                     d % 8 == 0 && q.dim() == 4;
  if (flash) return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, dropout, causal, false, scale));
  std::optional<Tensor> bias;
  if (mask && mask->defined()) {
    const Tensor m = *mask;
    bias = m.scalar_type() == at::kBool ? at::zeros(m.sizes(), q.options()) : m.to(q.scalar_type());
  }
  const bool grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  return std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, bias, grad, dropout, causal, scale));
}

std::tuple<Tensor, Tensor> rms_norm_forward(const Tensor& x, at::IntArrayRef shape, const std::optional<Tensor>&,
                                            std::optional<double>) {
  std::vector<int64_t> stat = x.sizes().vec();
  for (size_t i = 0; i < shape.size(); ++i) stat[stat.size() - 1 - i] = 1;
  return {at::empty_like(x), at::empty(stat, x.options().dtype(at::toOpMathType(x.scalar_type())))};
}

std::tuple<Tensor, Tensor> rms_norm_backward(const Tensor&, const Tensor& x, at::IntArrayRef, const Tensor&,
                                             const std::optional<Tensor>& w, std::array<bool, 2> mask) {
  return {mask[0] ? at::empty_like(x) : Tensor(), mask[1] && w && w->defined() ? at::empty_like(*w) : Tensor()};
}

void fused_adamw(at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                 double, double, double, double, double, bool, bool, const std::optional<Tensor>&,
                 const std::optional<Tensor>&) {}

void fused_adamw_tensor_lr(at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                           at::TensorList, const Tensor&, double, double, double, double, bool, bool,
                           const std::optional<Tensor>&, const std::optional<Tensor>&) {}

// There is no data to read: every scalar is 0 (the observer counts the read).
at::Scalar local_scalar(const Tensor& t) {
  if (t.scalar_type() == at::kBool) return at::Scalar(false);
  if (at::isFloatingType(t.scalar_type())) return at::Scalar(0.0);
  return at::Scalar(static_cast<int64_t>(0));
}

// The largest answer: every element is non-zero.
Tensor nonzero(const Tensor& t) { return at::empty({t.numel(), t.dim()}, t.options().dtype(at::kLong)); }

Tensor grouped_mm(const Tensor& a, const Tensor& b, const std::optional<Tensor>&, const std::optional<Tensor>&,
                  std::optional<at::ScalarType> dtype) {
  const auto opts = a.options().dtype(dtype.value_or(a.scalar_type()));
  if (a.dim() == 2 && b.dim() == 3) return at::empty({a.size(0), b.size(2)}, opts);
  if (a.dim() == 3 && b.dim() == 3) return at::empty({a.size(0), a.size(1), b.size(2)}, opts);
  if (a.dim() == 2 && b.dim() == 2) return at::empty({a.size(0), b.size(1)}, opts);  // offsets split K
  return at::empty({a.size(0), a.size(1), b.size(1)}, opts);
}

// Ops libtorch has no C++ meta kernel for that a training step runs.
// mm / bmm with an fp32 output from bf16 operands (weight gradients, model/mixed_matmul.h).
Tensor mm_dtype(const Tensor& a, const Tensor& b, at::ScalarType dtype) {
  return at::empty({a.size(0), b.size(1)}, a.options().dtype(dtype));
}

Tensor bmm_dtype(const Tensor& a, const Tensor& b, at::ScalarType dtype) {
  return at::empty({a.size(0), a.size(1), b.size(2)}, a.options().dtype(dtype));
}

// ... and accumulated into an fp32 gradient (out = self + a b, out aliasing
// self: mixed_matmul.h's param_weight_grad).
Tensor& addmm_dtype_out(const Tensor& self, const Tensor& a, const Tensor& b, at::ScalarType dtype, const at::Scalar&,
                        const at::Scalar&, Tensor& out) {
  TORCH_CHECK(out.scalar_type() == dtype && self.size(0) == a.size(0) && self.size(1) == b.size(1),
              "addmm.dtype_out (meta): shapes or dtype do not match");
  return out;
}

Tensor& baddbmm_dtype_out(const Tensor& self, const Tensor& a, const Tensor& b, at::ScalarType dtype,
                          const at::Scalar&, const at::Scalar&, Tensor& out) {
  TORCH_CHECK(out.scalar_type() == dtype && self.size(0) == a.size(0) && self.size(1) == a.size(1) &&
                  self.size(2) == b.size(2),
              "baddbmm.dtype_out (meta): shapes or dtype do not match");
  return out;
}

Tensor index_select(const Tensor& self, int64_t dim, const Tensor& index) {
  std::vector<int64_t> shape = self.sizes().vec();
  if (!shape.empty()) shape[static_cast<size_t>(dim < 0 ? dim + self.dim() : dim)] = index.numel();
  return at::empty(shape, self.options());
}

Tensor embedding_backward(const Tensor& grad, const Tensor&, c10::SymInt num_weights, c10::SymInt, bool) {
  return at::empty({num_weights.expect_int(), grad.size(-1)}, grad.options());
}

Tensor logical_not(const Tensor& self) { return at::empty_like(self, self.options().dtype(at::kBool)); }

Tensor meta_abs(const Tensor& self) { return at::empty_like(self); }

Tensor meta_where(const Tensor& cond, const Tensor& self, const Tensor& other) {
  const auto shape = at::infer_size_dimvector(at::infer_size_dimvector(cond.sizes(), self.sizes()), other.sizes());
  return at::empty(shape, self.options().dtype(at::result_type(self, other)));
}

std::tuple<Tensor, Tensor> native_dropout(const Tensor& x, double, std::optional<bool>) {
  return {at::empty_like(x), at::empty_like(x, x.options().dtype(at::kBool))};
}

Tensor native_dropout_backward(const Tensor& grad, const Tensor&, double) { return at::empty_like(grad); }

// CUDA's dropout is the fused native_dropout (one kernel each way), which
// at::dropout picks for CUDA tensors only.
Tensor dropout(const Tensor& x, double p, bool train) {
  if (!train || p == 0 || x.numel() == 0) return x;
  return std::get<0>(at::native_dropout(x, p, train));
}

// Swallows "overriding a previously registered kernel" while installing:
// replacing libtorch's meta kernels that throw is the point.
class QuietWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

void install_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    QuietWarnings quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    // Leaked on purpose: registrations live as long as the process.
    auto* meta = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    meta->impl("_scaled_dot_product_flash_attention", TORCH_FN(flash_forward));
    meta->impl("_scaled_dot_product_flash_attention_backward", TORCH_FN(flash_backward));
    meta->impl("_scaled_dot_product_efficient_attention", TORCH_FN(efficient_forward));
    meta->impl("_scaled_dot_product_efficient_attention_backward", TORCH_FN(efficient_backward));
    meta->impl("_fused_rms_norm", TORCH_FN(rms_norm_forward));
    meta->impl("_fused_rms_norm_backward", TORCH_FN(rms_norm_backward));
    meta->impl("_fused_adamw_", TORCH_FN(fused_adamw));
    meta->impl("_fused_adamw_.tensor_lr", TORCH_FN(fused_adamw_tensor_lr));
    meta->impl("_local_scalar_dense", TORCH_FN(local_scalar));
    meta->impl("nonzero", TORCH_FN(nonzero));
    meta->impl("_grouped_mm", TORCH_FN(grouped_mm));
    meta->impl("mm.dtype", TORCH_FN(mm_dtype));
    meta->impl("bmm.dtype", TORCH_FN(bmm_dtype));
    meta->impl("addmm.dtype_out", TORCH_FN(addmm_dtype_out));
    meta->impl("baddbmm.dtype_out", TORCH_FN(baddbmm_dtype_out));
    meta->impl("index_select", TORCH_FN(index_select));
    meta->impl("embedding_dense_backward", TORCH_FN(embedding_backward));
    meta->impl("logical_not", TORCH_FN(logical_not));
    meta->impl("abs", TORCH_FN(meta_abs));
    meta->impl("where.self", TORCH_FN(meta_where));
    meta->impl("native_dropout", TORCH_FN(native_dropout));
    meta->impl("native_dropout_backward", TORCH_FN(native_dropout_backward));
    // Above autograd: the composite would decompose into the math path.
    auto* autograd =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
    autograd->impl("scaled_dot_product_attention", TORCH_FN(sdpa));
    autograd->impl("dropout", TORCH_FN(dropout));
  });
}

}  // namespace meshtrain
