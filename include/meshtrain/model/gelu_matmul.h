#pragma once
// The GELU MLP's two GEMMs with the activation in their epilogues
// (ops/gelu_gemm.h), as autograd functions:
//   a = linear_gelu(x, w_in, b_in):   pre = x w_in^T + b_in and h = gelu(pre), one GEMM;
//   y = gelu_linear(a, w_out, ...):   h w_out^T, whose input gradient leaves its GEMM
//                                     already multiplied by gelu'(pre).
// So the activation has no kernel of its own, forward or backward. The
// autograd edge between the two is pre: gelu_linear's backward returns
// d(pre) and linear_gelu's backward takes it. h has no history; gelu_linear
// reads it as the value of gelu(pre) (its forward, and its weight gradient).
//
// Weights are parameters read through MixedPrecision::operand_detached (the
// fp32 master weights, FSDP's gathered casts); their gradients leave
// weight_grad in the parameter's dtype, summed in fp32 (model/mixed_matmul.h).
#include <ATen/core/Tensor.h>

namespace meshtrain {

class MixedPrecision;

struct GeluPre {
  at::Tensor pre;  // x w^T + b; undefined without grad mode (nothing will take its gradient)
  at::Tensor h;    // gelu(pre), in the compute dtype
};

// x [.., K] with w [N, K] and bias [N] (or undefined); batched: x [E, S, K]
// with w [E, N, K] and bias [E, N] (each expert's own).
GeluPre linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, MixedPrecision& precision);

// gelu(pre) w^T for a = linear_gelu(..): [.., H] times w [N, H] plus bias
// [N] or plus residual ([.., N], the compute dtype, contiguous; then no
// bias), folded into the GEMM; batched: [E, S, H] times w [E, N, H] (no bias
// or residual).
at::Tensor gelu_linear(const GeluPre& a, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual,
                       MixedPrecision& precision);

}  // namespace meshtrain
