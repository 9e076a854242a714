// meshtrain::linear_gelu / linear_dgelu (ops/gelu_gemm.h): schemas, the
// argument checks, the aten composite (the CPU kernel, and CUDA's where
// cuBLASLt declines), the meta kernels and the calls through the dispatcher
// (what the performance model's observer counts as GEMMs).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels.h"
#include "meshtrain/core/check.h"
#include "meshtrain/ops/gelu_gemm.h"
#include "meshtrain/ops/paths.h"

namespace meshtrain::ops {

namespace {

using impl::Opt;
using Pair = std::tuple<at::Tensor, at::Tensor>;

bool float_type(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kBFloat16 || s == at::kHalf;
}

void check_same(const char* op, const at::Tensor& a, const at::Tensor& b, const char* name) {
  MT_ASSERT(b.scalar_type() == a.scalar_type() && b.device() == a.device(), op, ": ", name, " is ", b.scalar_type(),
            " on ", b.device(), ", the first operand ", a.scalar_type(), " on ", a.device());
}

void check_linear_gelu(const at::Tensor& x, const at::Tensor& w, const Opt& bias) {
  const bool batched = x.dim() == 3;
  MT_ASSERT((x.dim() == 2 || batched) && w.dim() == x.dim() && float_type(x),
            "linear_gelu: x [M, K] and w [N, K] (or with a leading E) of a float type, got ", x.sizes(), " and ",
            w.sizes(), " ", x.scalar_type());
  MT_ASSERT(x.size(-1) == w.size(-1) && (!batched || x.size(0) == w.size(0)), "linear_gelu: x ", x.sizes(),
            " and w ", w.sizes(), " do not match");
  check_same("linear_gelu", x, w, "w");
  if (bias) {
    MT_ASSERT(bias->dim() == x.dim() - 1 && bias->size(-1) == w.size(-2) && (!batched || bias->size(0) == w.size(0)),
              "linear_gelu: bias ", bias->sizes(), " for w ", w.sizes());
    check_same("linear_gelu", x, *bias, "bias");
  }
}

void check_linear_dgelu(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre) {
  const bool batched = dy.dim() == 3;
  MT_ASSERT((dy.dim() == 2 || batched) && w.dim() == dy.dim() && pre.dim() == dy.dim() && float_type(dy),
            "linear_dgelu: dy [M, N], w [N, H] and pre [M, H] (or with a leading E) of a float type, got ",
            dy.sizes(), ", ", w.sizes(), " and ", pre.sizes());
  MT_ASSERT(dy.size(-1) == w.size(-2) && pre.size(-1) == w.size(-1) && pre.size(-2) == dy.size(-2) &&
                (!batched || (w.size(0) == dy.size(0) && pre.size(0) == dy.size(0))),
            "linear_dgelu: dy ", dy.sizes(), ", w ", w.sizes(), " and pre ", pre.sizes(), " do not match");
  check_same("linear_dgelu", dy, w, "w");
  check_same("linear_dgelu", dy, pre, "pre");
}

// a b with the products summed in fp32 ([.., M, K] x [.., K, N]): an fp32
// GEMM output where the backend has one, else (CPU) the exact fp32 upcast.
at::Tensor fp32_product(const at::Tensor& a, const at::Tensor& b) {
  const bool batched = a.dim() == 3;
  if (a.scalar_type() == at::kFloat) return batched ? at::bmm(a, b) : at::mm(a, b);
  if (a.is_cpu()) return fp32_product(a.to(at::kFloat), b.to(at::kFloat));
  return batched ? at::bmm(a, b, at::kFloat) : at::mm(a, b, at::kFloat);
}

Pair linear_gelu_ref(const at::Tensor& x, const at::Tensor& w, const Opt& bias) {
  check_linear_gelu(x, w, bias);
  at::Tensor acc = fp32_product(x, w.transpose(-2, -1));
  if (bias) acc.add_(x.dim() == 3 ? bias->unsqueeze(1) : *bias);
  return {acc.to(x.scalar_type()), at::gelu(acc, "tanh").to(x.scalar_type())};
}

at::Tensor linear_dgelu_ref(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre) {
  check_linear_dgelu(dy, w, pre);
  return at::gelu_backward(fp32_product(dy, w), pre.to(at::kFloat), "tanh").to(dy.scalar_type());
}

Pair linear_gelu_meta(const at::Tensor& x, const at::Tensor& w, const Opt& bias) {
  check_linear_gelu(x, w, bias);
  std::vector<int64_t> s = x.sizes().vec();
  s.back() = w.size(-2);
  return {at::empty(s, x.options()), at::empty(s, x.options())};
}

at::Tensor linear_dgelu_meta(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre) {
  check_linear_dgelu(dy, w, pre);
  return at::empty(pre.sizes(), dy.options());
}

// The CPU kernel: the composite is its one path.
Pair linear_gelu_cpu(const at::Tensor& x, const at::Tensor& w, const Opt& bias) {
  note_path("linear_gelu", true, "CPU kernel");
  return linear_gelu_ref(x, w, bias);
}

at::Tensor linear_dgelu_cpu(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre) {
  note_path("linear_dgelu", true, "CPU kernel");
  return linear_dgelu_ref(dy, w, pre);
}

#ifdef MESHTRAIN_CUDA
// cuBLASLt's epilogues where it takes the shapes, else the composite (its
// reason noted: ops/paths.h).
Pair linear_gelu_cuda(const at::Tensor& x, const at::Tensor& w, const Opt& bias) {
  check_linear_gelu(x, w, bias);
  std::vector<int64_t> s = x.sizes().vec();
  s.back() = w.size(-2);
  at::Tensor pre = at::empty(s, x.options()), h = at::empty(s, x.options());
  const Opt b = bias ? Opt(bias->contiguous()) : std::nullopt;
  const char* why_not = impl::lt_linear_gelu(x.contiguous(), w.contiguous(), b, pre, h);
  note_path("linear_gelu", why_not == nullptr, why_not ? why_not : "cuBLASLt GELU_AUX epilogue");
  if (!why_not) return {pre, h};
  return linear_gelu_ref(x, w, bias);
}

at::Tensor linear_dgelu_cuda(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre) {
  check_linear_dgelu(dy, w, pre);
  at::Tensor out = at::empty(pre.sizes(), dy.options());
  const char* why_not = impl::lt_linear_dgelu(dy.contiguous(), w.contiguous(), pre.contiguous(), out);
  note_path("linear_dgelu", why_not == nullptr, why_not ? why_not : "cuBLASLt DGELU epilogue");
  if (!why_not) return out;
  return linear_dgelu_ref(dy, w, pre);
}
#endif

}  // namespace

std::pair<at::Tensor, at::Tensor> linear_gelu(const at::Tensor& x, const at::Tensor& w, const Opt& bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::linear_gelu", "")
                             .typed<Pair(const at::Tensor&, const at::Tensor&, const Opt&)>();
  auto [pre, h] = op.call(x, w, bias);
  return {pre, h};
}

at::Tensor linear_dgelu(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::linear_dgelu", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(dy, w, pre);
}

TORCH_LIBRARY_FRAGMENT(meshtrain, m) {
  m.def("linear_gelu(Tensor x, Tensor w, Tensor? bias) -> (Tensor, Tensor)");
  m.def("linear_dgelu(Tensor dy, Tensor w, Tensor pre) -> Tensor");
}

TORCH_LIBRARY_IMPL(meshtrain, CPU, m) {
  m.impl("linear_gelu", TORCH_FN(linear_gelu_cpu));
  m.impl("linear_dgelu", TORCH_FN(linear_dgelu_cpu));
}
TORCH_LIBRARY_IMPL(meshtrain, Meta, m) {
  m.impl("linear_gelu", TORCH_FN(linear_gelu_meta));
  m.impl("linear_dgelu", TORCH_FN(linear_dgelu_meta));
}
#ifdef MESHTRAIN_CUDA
TORCH_LIBRARY_IMPL(meshtrain, CUDA, m) {
  m.impl("linear_gelu", TORCH_FN(linear_gelu_cuda));
  m.impl("linear_dgelu", TORCH_FN(linear_dgelu_cuda));
}
#else
TORCH_LIBRARY_IMPL(meshtrain, CUDA, m) {
  m.impl("linear_gelu", TORCH_FN(linear_gelu_ref));
  m.impl("linear_dgelu", TORCH_FN(linear_dgelu_ref));
}
#endif

}  // namespace meshtrain::ops
