#pragma once
// Fused kernels of the training step: each is one kernel forward and one
// backward on CUDA where a chain of aten ops would be several, each reading
// and writing whole activations (issue: the step was memory-bound outside
// its matmuls). They are registered as operators (namespace "meshtrain") so
// the performance model's operator observer sees them as single kernels.
//
// Every op has a CPU kernel (the same row math as the CUDA one, src/ops/
// row_math.h), a meta kernel (shapes only) and, where the build has nvcc, a
// CUDA kernel; a CUDA build without nvcc runs the aten composite instead.
// Math is fp32 whatever the storage dtype (fp32, bf16, fp16).
//
// Where the step's non-GEMM work goes, and where each piece is explained
// (docs/ARCHITECTURE.md keeps one paragraph and points here):
//   RoPE            rope / qkv_rope / rope_concat below: q and k rotated
//                   straight out of the one QKV GEMM's output, MLA's query
//                   rope written into its concatenation; the pair and vector
//                   arithmetic and the 32-bit index split: src/ops/row_math.h.
//   RMSNorm         rms_norm / residual_rms_norm / add_rms_norm below; how a
//                   layer's residual adds fold into its output GEMMs (no add
//                   kernel without dropout) or into the next norm (with it):
//                   Block::layer in src/model/block.cpp, Linear::forward_residual
//                   in model/layers.h.
//   the LM head     cross_entropy_rows_ below, chunk by chunk over a padded
//                   vocabulary: model/cross_entropy.h; a tied embedding's
//                   summed gradient: model/mixed_matmul.h (TiedGrad); the
//                   vocabulary-parallel head: softmax_stats / softmax_grad_
//                   below, src/parallel/vocab_parallel.h.
//   MoE             dispatch and combine, one kernel each way: ops/slot_rows.h;
//                   capacity slots and dropless grouped GEMMs: model/moe.h.
//   the MLP's GELU  in the GEMMs' epilogues: ops/gelu_gemm.h, model/gelu_matmul.h,
//                   model/activation.h (mlp_forward).
//   MLA's v         padded only as far as the attention kernel needs:
//                   model/attention.h (value_width_for).
//   AdamW           bf16 or fp32 moments, the weights' bf16 casts written in
//                   the same pass: ops/adamw.h, src/ops/adamw_math.h.
//   CUDA launches   shapes: src/ops/cuda_kernels.h; limits that depend on the
//                   device: src/ops/launch_plan.h.
//   which path      16-byte vectors or elements, cuBLASLt or the composite,
//                   fused attention or math, per call: ops/paths.h.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace meshtrain::ops {

// ---- rotary embedding ------------------------------------------------------
// cos/sin tables, fp32 [positions, dim/2] on x's device (model/layers.h's
// Rotary caches them): angle(p, i) = p * theta^(-2i/dim).
struct RopeTables {
  at::Tensor cos, sin;
};
RopeTables rope_tables(int64_t dim, int64_t positions, double theta, const at::Device& device);

// x [..., T, ..., dim] rotated at positions offset.. along dim seq_dim, the
// halves convention (features i and i + dim/2 form a pair). Differentiable.
at::Tensor rope(const at::Tensor& x, const RopeTables& t, int64_t offset, int64_t seq_dim);

// cat({head, rope(x)}, -1) with head [..., h] and x [..., r] alike before
// the last dim: one buffer written once (head copied, x rotated into it)
// instead of a rotated x copied again by the concatenation (MLA's queries:
// each head's no-rope and rope parts). Differentiable.
at::Tensor rope_concat(const at::Tensor& head, const at::Tensor& x, const RopeTables& t, int64_t offset,
                       int64_t seq_dim);

// The attention input: qkv [B, T, 3, H, hd] (one GEMM's output) -> q and k
// rotated, v as it is, each [B, H, T, hd] (views, as flash attention takes
// them). Forward: one kernel rotates q and k together; backward: dq and dk
// rotated back straight into d(qkv) (no concatenation). Differentiable.
std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rope(const at::Tensor& qkv, const RopeTables& t, int64_t offset);

// ---- RMSNorm ----------------------------------------------------------------
// y = x * rstd * w (+ bias), in x's dtype; w and bias fp32 (the parameters,
// read as they are: no cast kernel). Differentiable.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, double eps);

// The norm of a residual stream x that flows on past it: returns (x, the
// norm). Use the first for x's other consumers: its gradient is then summed
// into d(x) inside the norm's backward kernel (no separate add kernel).
std::pair<at::Tensor, at::Tensor> residual_rms_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                                                    double eps);

// The residual add fused with the next norm: h = a + b, y = rms_norm(h).
// Backward is one kernel too: d(h) from both consumers summed inside.
std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& w,
                                               const at::Tensor& bias, double eps);

// ---- cross-entropy over rows of logits (not differentiable: the callers
// keep the gradient, model/cross_entropy.h and parallel/vocab_parallel.cpp) --
// Per row of z [N, V]: the loss logsumexp(z) - z[target] (fp32 [N]), and,
// when grad, z overwritten by softmax(z) - onehot(target) (one read, one write).
at::Tensor cross_entropy_rows_(at::Tensor& z, const at::Tensor& targets, bool grad);

// Vocabulary shards: the online max and sum of exp over the first `valid`
// columns of each row, and z[row, target] (0 when target is outside
// [0, valid): another shard's). Returns [3, N] fp32: max, sum, picked.
at::Tensor softmax_stats(const at::Tensor& z, const at::Tensor& targets, int64_t valid);
// z overwritten by exp(z - lse) - onehot(target), 0 in the columns past valid.
void softmax_grad_(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, int64_t valid);

// Whether this build runs its own CUDA kernels (else the aten composites).
bool have_cuda_kernels();

}  // namespace meshtrain::ops
