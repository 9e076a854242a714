#include "meshtrain/model/matmul_dtype.h"

#include <ATen/ATen.h>

namespace meshtrain {

namespace {
// Per thread, like autocast's own state; only the guard writes it.
thread_local std::optional<at::ScalarType> t_matmul_dtype;
}  // namespace

MatmulDtypeGuard::MatmulDtypeGuard(std::optional<at::ScalarType> dtype) : saved_(t_matmul_dtype) {
  t_matmul_dtype = dtype;
}

MatmulDtypeGuard::~MatmulDtypeGuard() { t_matmul_dtype = saved_; }

at::Tensor matmul_operand(const at::Tensor& t) {
  if (!t_matmul_dtype || !t.is_floating_point() || t.scalar_type() == *t_matmul_dtype) return t;
  return t.to(*t_matmul_dtype);
}

at::Tensor mp_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!b.defined()) return at::linear(matmul_operand(x), matmul_operand(w));
  return at::linear(matmul_operand(x), matmul_operand(w), matmul_operand(b));
}

}  // namespace meshtrain
