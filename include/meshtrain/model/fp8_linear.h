#pragma once
// FP8 training (model_config.fp8_recipe) of the model's linear GEMMs, as
// autograd functions over ops/fp8.h: the forward y = x W^T, the input
// gradient dx = dy W and the weight gradient dW = dy^T x each take two FP8
// operands quantized just in time and sum their products in fp32
// (ops::fp8_mm: at::_scaled_mm where the device takes the scaling, else its
// exact emulation). They run on top of the bf16 policy (mixed_precision.h):
// inputs and outputs are bf16, every weight is quantized from its bf16 cast
// (so FSDP's bf16 gathers and the optimizer's kept casts quantize the same
// bits), the weight gradients leave the GEMM in fp32 for the fp32 master
// weights, and the quantized weights are shared within a round as the casts
// are (MixedPrecision::fp8_weight).
//
// Recipes, per GEMM operand [rows, reduction] (docs/precision.md):
//   tensorwise  x, W: e4m3, one scale per tensor; dy: e5m2, one scale per
//               tensor; the backward GEMMs read these transposed (torchtitan).
//   rowwise     e4m3, a scale per row of each operand along its reduction:
//               x and W per row in the forward, dy per token and W per input
//               column for dx, dy and x per channel over the tokens for dW.
//   blockwise   e4m3, DeepSeek-V3: x and dy in 1x128 tiles along the
//               reduction (the tokens' for dW), W in 128x128 blocks.
//
// One FP8 process on every mesh. A scale group whose elements a mesh spreads
// over ranks has its amax max-reduced over those ranks before the scale is
// taken (Fp8Split), so every rank quantizes each element as one process
// would; then the GEMMs sum the same products, grouped as the bf16 mesh
// groups them:
//   tp     splits the weight's rows (column-parallel: out) or the reduction
//          (row-parallel: in); a replicated layer under sequence parallelism
//          reads the sequence shard (tokens).
//   cp     splits every sequence: MixedPrecision::fp8_token_reduce.
//   dp, pp a rank's microbatch is one process's microbatch (the one process
//          compared runs the same micro_batch_size): nothing is split.
//   ep     an expert's rows come from several senders' microbatches; each
//          sender's rows are quantized as that sender's own operand (their
//          scale groups never mix senders: `segments`, the dropless groups).
//   FSDP   gathers the bf16 casts the one process quantizes.
// Tensorwise groups span both dims, rowwise groups the reduction dim; the
// 1x128 tiles and 128x128 blocks of blockwise are never reduced: config
// validation refuses meshes that would cut one (docs/precision.md).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "meshtrain/config/choices.h"
#include "meshtrain/ops/fp8.h"

namespace meshtrain {

class MixedPrecision;

// Max-reduces an amax tensor in place over the ranks holding the other
// parts of a split dim.
using AmaxReduce = std::function<void(at::Tensor& amax)>;

// Which dims of a layer's GEMMs a mesh splits, as the reductions that undo
// the split for the scales; each empty where that dim is whole on the rank.
struct Fp8Split {
  AmaxReduce out;     // the weight's rows, the output features (tp: column-parallel)
  AmaxReduce in;      // the reduction dim, the input features (tp: row-parallel)
  AmaxReduce tokens;  // the activations' rows (sequence parallelism's shard read by a replicated layer)
};

// Format and scale granularity of one kind of operand.
struct Fp8Operand {
  at::ScalarType dtype = at::kFloat8_e4m3fn;
  ops::Fp8Granularity granularity = ops::Fp8Granularity::kTensor;
};

// A recipe's operands: the forward's input and weight, and the output
// gradient. An operand whose tiles are symmetric (kTensor, kBlock) is read
// transposed by the backward GEMMs; the others are quantized anew along the
// other dim.
struct Fp8Plan {
  Fp8Operand x, w, dy;
  static Fp8Plan of(Fp8Recipe recipe);
};

// t [R, C] or [E, R, C] (C the reduction dim of its GEMM) quantized as `op`,
// the amax of each scale group max-reduced over `rows` and/or `cols` where
// the group spans that dim and a mesh splits it (empty: not split).
ops::Fp8Tensor fp8_quantize(const at::Tensor& t, Fp8Operand op, const AmaxReduce& rows, const AmaxReduce& cols);

// x [.., K] times each weight [N_i, K] transposed, the products side by side
// ([.., sum N_i]), plus the biases (all or none) or plus residual, in the
// compute dtype: each weight its own FP8 GEMM (its own scales), x quantized
// once. The weights are fp32 parameters marked FP8 with `split`; their
// gradients come out fp32 (deferred with MixedPrecision's weight-gradient
// queue); the bias and residual gradients as mixed_linear's.
at::Tensor fp8_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases, const at::Tensor& residual,
                      MixedPrecision& precision, const Fp8Split& split);

// The experts' batched GEMM: x [E, segments * S, K] times w[e] [N, K]
// transposed -> [E, segments * S, N], each expert's rows in `segments` blocks
// of S (expert parallelism: one per sender), each block its own operand.
at::Tensor fp8_batched_linear(const at::Tensor& x, const at::Tensor& w, MixedPrecision& precision,
                              const Fp8Split& split, int64_t segments);

// The dropless experts' grouped GEMM: rows [M, K] in groups of `counts`
// rows (int, on the device: expert g's rows after expert g-1's) times w[g]
// [N, K] transposed -> [M, N]. row_group [M] (int64, ascending) cuts each
// expert's rows further, one group per sender (expert parallelism), into
// n_groups operands of their own. The GEMMs are emulated exactly: the
// operands quantized, dequantized to fp32 and multiplied in fp32
// (_scaled_grouped_mm is not yet measured).
at::Tensor fp8_grouped_linear(const at::Tensor& rows, const at::Tensor& w, const at::Tensor& counts,
                              const at::Tensor& row_group, int64_t n_groups, MixedPrecision& precision,
                              const Fp8Split& split);

}  // namespace meshtrain
