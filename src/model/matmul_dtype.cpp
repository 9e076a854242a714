#include "meshtrain/model/matmul_dtype.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <unordered_map>

namespace meshtrain {

namespace {

// Per thread, like autocast's own state; only the guard writes it.
struct State {
  std::optional<at::ScalarType> dtype;
  int depth = 0;
  // As autocast: casts of leaf parameters are made once per (outermost)
  // guard, so microbatches of one round share them.
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> cache;  // impl -> (source, cast)
};
thread_local State t_state;

}  // namespace

MatmulDtypeGuard::MatmulDtypeGuard(std::optional<at::ScalarType> dtype) : saved_(t_state.dtype) {
  t_state.dtype = dtype;
  ++t_state.depth;
}

MatmulDtypeGuard::~MatmulDtypeGuard() {
  t_state.dtype = saved_;
  if (--t_state.depth == 0) t_state.cache.clear();
}

at::Tensor matmul_operand(const at::Tensor& t) {
  if (!t_state.dtype || !t.is_floating_point() || t.scalar_type() == *t_state.dtype) return t;
  if (!(t.is_leaf() && t.requires_grad())) return t.to(*t_state.dtype);
  auto it = t_state.cache.find(t.unsafeGetTensorImpl());
  if (it != t_state.cache.end()) return it->second.second;
  // A cast made without grad mode (inside a custom autograd function) has no
  // history: cached, it would cut the gradient of a later use outside one.
  if (!at::GradMode::is_enabled()) return t.to(*t_state.dtype);
  return t_state.cache.emplace(t.unsafeGetTensorImpl(), std::make_pair(t, t.to(*t_state.dtype))).first->second.second;
}

at::Tensor mp_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!b.defined()) return at::linear(matmul_operand(x), matmul_operand(w));
  return at::linear(matmul_operand(x), matmul_operand(w), matmul_operand(b));
}

}  // namespace meshtrain
