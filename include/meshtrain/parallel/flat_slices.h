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

// AdamW's slots (optim/adamw.h) over owned slices: one per run of each,
// with its weight decay; the moments are views of exp_avg[k] and
// exp_avg_sq[k], slice k's state ([slice] each), cut by runs[k].
std::vector<OptimParam> slice_slots(const std::vector<const SliceRuns*>& runs, const std::vector<at::Tensor>& exp_avg,
                                    const std::vector<at::Tensor>& exp_avg_sq);
// The same runs of per-slice tensors (the values to update, their
// gradients), as views in slice_slots' order.
std::vector<at::Tensor> slice_run_views(const std::vector<const SliceRuns*>& runs,
                                        const std::vector<at::Tensor>& slices);

}  // namespace meshtrain
