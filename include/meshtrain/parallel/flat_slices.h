#pragma once
// What ZeRO-1 (parallel/zero.h) and FSDP (parallel/fsdp.h) both need of a
// flat fp32 space of parameters of which this rank owns [begin, begin+slice):
// the runs of the slice by weight decay (AdamW's two groups) and which of its
// elements count in the global gradient norm.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

struct SliceRuns {
  std::vector<std::tuple<int64_t, int64_t, bool>> runs;  // [lo, hi) of the slice, weight decay
  at::Tensor norm_mask;  // [slice] double, 1 where the element counts in the global norm
};

// params[j] (indices into pm.params) starts at offsets[j] of the space.
SliceRuns slice_runs(const ParallelModel& pm, const Mesh& mesh, const std::vector<size_t>& params,
                     const std::vector<int64_t>& offsets, int64_t begin, int64_t slice);

// The space [padded] (every rank's slices, gathered) cut back into tensors of
// the parameters' shapes: out[params[j]] (views of flat).
void unflatten(const ParallelModel& pm, const std::vector<size_t>& params, const std::vector<int64_t>& offsets,
               const at::Tensor& flat, std::vector<at::Tensor>& out);

// The owned slice [slice] of per-parameter tensors (indexed like pm.params;
// undefined: zeros), for moments loaded from a checkpoint.
at::Tensor slice_of(const ParallelModel& pm, const std::vector<size_t>& params, const std::vector<int64_t>& offsets,
                    int64_t begin, int64_t slice, const std::vector<at::Tensor>& per_param, const at::TensorOptions& opts);

// AdamW's fused update (optim/adamw.h fused_adamw) over owned slices, each cut
// into its runs with and without weight decay (two groups, as AdamW::step):
// slice k is params[k] with grads[k], exp_avg[k], exp_avg_sq[k] and runs[k].
// step (0-dim fp32) advances unless found_inf is set; grad_scale: see fused_adamw.
void adamw_on_slices(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                     const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq,
                     const std::vector<const SliceRuns*>& runs, at::Tensor& step, const LearningRate& lr, const LrConfig& cfg,
                     const at::Tensor& found_inf, const at::Tensor& grad_scale);

}  // namespace meshtrain
