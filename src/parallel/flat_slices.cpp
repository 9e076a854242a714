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

void adamw_on_slices(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                     const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq,
                     const std::vector<const SliceRuns*>& runs, at::Tensor& step, const LearningRate& lr, const LrConfig& cfg,
                     const at::Tensor& found_inf, const at::Tensor& grad_scale) {
  std::vector<at::Tensor> p[2], g[2], m[2], v[2];
  for (size_t k = 0; k < params.size(); ++k)
    for (const auto& [lo, hi, decay] : runs[k]->runs) {
      const int i = decay ? 1 : 0;
      p[i].push_back(params[k].narrow(0, lo, hi - lo));
      g[i].push_back(grads[k].narrow(0, lo, hi - lo));
      m[i].push_back(exp_avg[k].narrow(0, lo, hi - lo));
      v[i].push_back(exp_avg_sq[k].narrow(0, lo, hi - lo));
    }
  step.add_(1);
  for (int i = 0; i < 2; ++i)
    fused_adamw(p[i], g[i], m[i], v[i], step, lr, cfg, i == 1 ? cfg.weight_decay : 0.0, found_inf, grad_scale);
  if (found_inf.defined()) step.sub_(found_inf);
}

}  // namespace meshtrain
