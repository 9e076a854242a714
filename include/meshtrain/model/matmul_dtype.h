#pragma once
// Mixed precision where at::autocast does not reach. On CUDA, autocast runs
// matmuls and attention in bf16 while parameters, the residual stream and the
// statistics stay fp32. The meta device (the performance model of `bench
// --device meta`) has no autocast, so there the trainer sets a matmul dtype
// for the thread and the layers cast their matmul operands to it themselves,
// exactly where autocast would. Unset (CPU, CUDA): no cast.
#include <ATen/core/Tensor.h>

#include <optional>

namespace meshtrain {

class MatmulDtypeGuard {
 public:
  explicit MatmulDtypeGuard(std::optional<at::ScalarType> dtype);
  ~MatmulDtypeGuard();
  MatmulDtypeGuard(const MatmulDtypeGuard&) = delete;
  MatmulDtypeGuard& operator=(const MatmulDtypeGuard&) = delete;

 private:
  std::optional<at::ScalarType> saved_;
};

// t in this thread's matmul dtype when one is set and t is floating point.
at::Tensor matmul_operand(const at::Tensor& t);
// at::linear(x, w, b) with the operands in the matmul dtype (b may be undefined).
at::Tensor mp_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

}  // namespace meshtrain
