#pragma once
// The output head's GEMM and cross-entropy, without ever holding fp32 logits:
// chunk by chunk of tokens, the logits GEMM writes (in the matmul dtype) into
// one [N, V] buffer and one fused kernel per chunk (ops/fused.h) turns each
// row into its loss (fp32 accumulation) and overwrites it with its gradient,
// softmax - onehot: one read and one write of the logits in all. The
// backward is just the two GEMMs: dh = g * (d @ W) and dW = d^T (g * h), with
// the per-token upstream gradient g applied to the small [N, d] side.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace meshtrain {

class MixedPrecision;

// h [N, d], weight [V, d], targets [N] int64 -> per-token losses [N] fp32.
// chunk_rows <= 0: chunks of about 128M logits (a bound on one kernel's size,
// and on evaluation's buffer, which holds one chunk). The GEMMs take their
// operands in `precision`'s compute dtype (nullptr: as they come).
at::Tensor chunked_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_rows = 0, MixedPrecision* precision = nullptr);

// dW = dy^T x for a weight of dtype param_dtype, accumulated in fp32 when
// dy and x are bf16/fp16 and the weight fp32: a GEMM with an fp32 output
// where the backend has one (CUDA, meta), else (CPU) the exact fp32 upcast
// of the operands, so every device sums the products in fp32.
at::Tensor weight_grad(const at::Tensor& dy, const at::Tensor& x, at::ScalarType param_dtype);

}  // namespace meshtrain
