#pragma once
// Mixed precision, spelled out in the layers (not at::autocast): with a
// matmul dtype set for the thread (bf16 on CUDA and on the meta device of
// `bench --device meta`, the trainer's guard), the layers cast their matmul
// operands to it, so GEMMs, attention and the residual stream run in bf16
// while parameters, gradients and AdamW state stay fp32 (the master weights)
// and the fused kernels keep fp32 statistics (ops/fused.h). Explicit casts
// make the step on a GPU exactly the one the performance model counts.
// Unset (CPU): no cast.
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
