#include "meshtrain/parallel/flat_slices.h"

#include <torch/torch.h>

#include <algorithm>

#include "meshtrain/core/check.h"
#include "meshtrain/optim/adamw.h"

namespace meshtrain {

SliceRuns slice_runs(const ParallelModel& pm, const Mesh& mesh, const std::vector<size_t>& params,
                     const std::vector<int64_t>& offsets, int64_t begin, int64_t slice) {
  SliceRuns r;
  const auto opts = pm.params.front().tensor.options().dtype(at::kDouble).requires_grad(false);
  r.norm_mask = at::zeros({slice}, opts);
  const bool tp_lead = mesh.coord().tp == 0;
  for (size_t j = 0; j < params.size(); ++j) {
    const ParamInfo& p = pm.params[params[j]];
    const int64_t lo = std::max(offsets[j], begin), hi = std::min(offsets[j] + p.tensor.numel(), begin + slice);
    if (lo >= hi) continue;
    // Adjacent parameters alike merge; the padding past the last parameter
    // is never updated.
    if (!r.runs.empty() && std::get<2>(r.runs.back()) == p.decay && std::get<1>(r.runs.back()) == lo - begin)
      std::get<1>(r.runs.back()) = hi - begin;
    else
      r.runs.emplace_back(lo - begin, hi - begin, p.decay);
    // As grad_norm (parallel/data_parallel.h): tp replicas only from tp rank 0, the tied head copy never.
    const bool counted = !p.layout.tied_copy && (p.layout.split_dim >= 0 || tp_lead);
    if (counted) r.norm_mask.narrow(0, lo - begin, hi - lo).fill_(1.0);
  }
  return r;
}

void unflatten(const ParallelModel& pm, const std::vector<size_t>& params, const std::vector<int64_t>& offsets,
               const at::Tensor& flat, std::vector<at::Tensor>& out) {
  for (size_t j = 0; j < params.size(); ++j) {
    const ParamInfo& p = pm.params[params[j]];
    out[params[j]] = flat.narrow(0, offsets[j], p.tensor.numel()).view(p.tensor.sizes());
  }
}

at::Tensor slice_of(const ParallelModel& pm, const std::vector<size_t>& params, const std::vector<int64_t>& offsets,
                    int64_t begin, int64_t slice, const std::vector<at::Tensor>& per_param, const at::TensorOptions& opts) {
  at::Tensor out = at::zeros({slice}, opts);
  for (size_t j = 0; j < params.size(); ++j) {
    const size_t i = params[j];
    const int64_t n = pm.params[i].tensor.numel();
    const int64_t lo = std::max(offsets[j], begin), hi = std::min(offsets[j] + n, begin + slice);
    if (lo >= hi || !per_param[i].defined()) continue;
    MT_CHECK(per_param[i].numel() == n, "optimizer state for parameter '", pm.params[i].layout.global_name, "' has ",
             per_param[i].numel(), " elements, expected ", n);
    out.narrow(0, lo - begin, hi - lo).copy_(per_param[i].reshape({-1}).narrow(0, lo - offsets[j], hi - lo));
  }
  return out;
}

std::vector<OptimParam> slice_slots(const std::vector<const SliceRuns*>& runs, const std::vector<at::Tensor>& exp_avg,
                                    const std::vector<at::Tensor>& exp_avg_sq) {
  std::vector<OptimParam> slots;
  for (size_t k = 0; k < runs.size(); ++k)
    for (const auto& [lo, hi, decay] : runs[k]->runs)
      slots.push_back({"", at::Tensor(), decay, exp_avg[k].narrow(0, lo, hi - lo), exp_avg_sq[k].narrow(0, lo, hi - lo)});
  return slots;
}

std::vector<at::Tensor> slice_run_views(const std::vector<const SliceRuns*>& runs,
                                        const std::vector<at::Tensor>& slices) {
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < runs.size(); ++k)
    for (const auto& [lo, hi, decay] : runs[k]->runs) out.push_back(slices[k].narrow(0, lo, hi - lo));
  return out;
}

}  // namespace meshtrain
