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
struct TiedGrad;

// h [N, d], weight [V, d], targets [N] int64 -> per-token losses [N] fp32.
// The GEMMs run over padded_vocab(V) columns; the losses read the first V.
// chunk_rows <= 0: chunks of about 128M logits (a bound on one kernel's size,
// and on evaluation's buffer, which holds one chunk). The GEMMs take their
// operands in `precision`'s compute dtype (nullptr: as they come). tied
// (optional): weight is a tied embedding's on this stage, whose backward
// takes the weight's gradient from there (model/mixed_matmul.h's TiedGrad).
at::Tensor chunked_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_rows = 0, MixedPrecision* precision = nullptr,
                                 TiedGrad* tied = nullptr);

// The vocabulary the head's GEMMs compute with: vocab rounded up to a
// multiple of 128, so the logits' rows, the cast weight and the weight
// gradient keep the leading dimensions tensor-core GEMMs are aligned for (an
// odd vocabulary such as 100277 costs them their aligned kernels). The padded
// rows of the weight are zero and their logits are never counted: losses,
// gradients and sampling see exactly `vocab` columns; the parameters keep
// their real size.
int64_t padded_vocab(int64_t vocab);


}  // namespace meshtrain
