#pragma once
// The output head's GEMM and cross-entropy, without ever holding fp32 logits
// for the whole batch: logits are made chunk by chunk of tokens, each chunk's
// log-softmax runs with fp32 accumulation (fp32 output only for that chunk),
// and the gradient of the logits, softmax - onehot (in the matmul dtype), is
// written in the forward into one [N, V] buffer, so the backward is just the
// two GEMMs: dh = g * (d @ W) and dW = d^T (g * h), with the per-token
// upstream gradient g applied to the small [N, d] side.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace meshtrain {

// h [N, d], weight [V, d], targets [N] int64 -> per-token losses [N] fp32.
// chunk_rows <= 0: a chunk size keeping each chunk's fp32 log-probabilities near 512 MiB.
at::Tensor chunked_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_rows = 0);

}  // namespace meshtrain
