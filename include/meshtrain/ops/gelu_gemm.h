#pragma once
// GEMMs with GPT-2's tanh GELU in their epilogue (operators
// meshtrain::linear_gelu / meshtrain::linear_dgelu): the MLP's activation
// costs no kernel of its own either way (issue: the GELU's forward and
// backward were 15 GB of a moe1B step's traffic, each reading and writing
// the [tokens, hidden] activations).
//
// Forward, the first GEMM writes the pre-activation and its GELU together;
// backward, the second GEMM's input gradient is multiplied by GELU's
// derivative at the saved pre-activation before it is written. On CUDA both
// are one cuBLASLt call (epilogues GELU_AUX(_BIAS) and DGELU, as llm.c's);
// where cuBLASLt declines a shape, and on the CPU, the same math as aten ops.
//
// The math, whatever the device: the products are summed in fp32, the bias
// added in fp32, and the GELU (or its derivative) taken of that fp32 sum;
// each output is rounded once to the operands' dtype. (A bf16 GEMM followed
// by aten's gelu takes the GELU of the rounded sum instead.)
#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>

namespace meshtrain::ops {

// pre = x w^T + bias and h = gelu_tanh(pre), both [M, N] in x's dtype.
// x [M, K], w [N, K], bias [N]; or batched: x [E, M, K], w [E, N, K], bias
// [E, N] (each expert its own). Operands of one float dtype. Not differentiable
// (model/gelu_matmul.h builds the autograd functions on it).
std::pair<at::Tensor, at::Tensor> linear_gelu(const at::Tensor& x, const at::Tensor& w,
                                              const std::optional<at::Tensor>& bias);

// (dy w) * gelu_tanh'(pre): the gradient of pre where y = gelu(pre) w^T.
// dy [M, N], w [N, H], pre [M, H] -> [M, H]; or batched with a leading E.
at::Tensor linear_dgelu(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre);

}  // namespace meshtrain::ops
