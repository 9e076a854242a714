#include "meshtrain/parallel/zero.h"

#include <torch/torch.h>

#include <cmath>

#include "meshtrain/core/check.h"
#include "meshtrain/optim/adamw.h"

namespace meshtrain {

ZeroOptimizer::ZeroOptimizer(ParallelModel& pm, Mesh& mesh, const LrConfig& cfg) : pm_(pm), mesh_(mesh), cfg_(cfg) {
  MT_CHECK(!pm.params.empty(), "zero_stage 1: this rank has no parameters");
  int64_t total = 0;
  for (const auto& p : pm.params) {
    offsets_.push_back(total);
    total += p.tensor.numel();
  }
  const int64_t dp = mesh.shape().dp;
  padded_ = (total + dp - 1) / dp * dp;
  slice_ = padded_ / dp;
  begin_ = mesh.coord().dp * slice_;

  const auto opts = pm.params.front().tensor.options().dtype(at::kFloat).requires_grad(false);
  exp_avg_ = at::zeros({slice_}, opts);
  exp_avg_sq_ = at::zeros({slice_}, opts);
  grad_ = at::zeros({slice_}, opts);
  step_t_ = at::zeros({}, opts);
  norm_mask_ = at::zeros({slice_}, opts.dtype(at::kDouble));
  const bool tp_lead = mesh.coord().tp == 0;
  for (size_t i = 0; i < pm.params.size(); ++i) {
    const ParamInfo& p = pm.params[i];
    const int64_t lo = std::max(offsets_[i], begin_), hi = std::min(offsets_[i] + p.tensor.numel(), begin_ + slice_);
    if (lo >= hi) continue;
    // Runs of the slice by weight decay (adjacent parameters alike merge);
    // the padding past the last parameter is never updated.
    if (!runs_.empty() && std::get<2>(runs_.back()) == p.decay && std::get<1>(runs_.back()) == lo - begin_)
      std::get<1>(runs_.back()) = hi - begin_;
    else
      runs_.emplace_back(lo - begin_, hi - begin_, p.decay);
    // As global_grad_norm: tp replicas only from tp rank 0, the tied head copy never.
    const bool counted = !p.layout.tied_copy && (p.layout.split_dim >= 0 || tp_lead);
    if (counted) norm_mask_.narrow(0, lo - begin_, hi - lo).fill_(1.0);
  }
}

at::Tensor ZeroOptimizer::flat_of(const std::vector<at::Tensor>& per_param) const {
  at::Tensor flat = at::zeros({padded_}, grad_.options());
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    if (!per_param[i].defined()) continue;
    const int64_t n = pm_.params[i].tensor.numel();
    MT_CHECK(per_param[i].numel() == n, "zero_stage 1: tensor for parameter '", pm_.params[i].layout.global_name,
             "' has ", per_param[i].numel(), " elements, expected ", n);
    flat.narrow(0, offsets_[i], n).copy_(per_param[i].reshape({-1}));
  }
  return flat;
}

at::Tensor ZeroOptimizer::owned_slice(const std::vector<at::Tensor>& per_param) const {
  at::Tensor out = at::zeros({slice_}, grad_.options());
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    const int64_t n = pm_.params[i].tensor.numel();
    const int64_t lo = std::max(offsets_[i], begin_), hi = std::min(offsets_[i] + n, begin_ + slice_);
    if (lo >= hi || !per_param[i].defined()) continue;
    MT_CHECK(per_param[i].numel() == n, "zero_stage 1: tensor for parameter '", pm_.params[i].layout.global_name,
             "' has ", per_param[i].numel(), " elements, expected ", n);
    out.narrow(0, lo - begin_, hi - lo).copy_(per_param[i].reshape({-1}).narrow(0, lo - offsets_[i], hi - lo));
  }
  return out;
}

std::vector<at::Tensor> ZeroOptimizer::unflatten(const at::Tensor& flat) const {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    const at::Tensor& p = pm_.params[i].tensor;
    out.push_back(flat.narrow(0, offsets_[i], p.numel()).view(p.sizes()));
  }
  return out;
}

at::Tensor ZeroOptimizer::reduce_gradients() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : pm_.params) grads.push_back(p.tensor.grad());
  at::Tensor flat = flat_of(grads);
  // The full gradients are no longer needed: free them before the collective.
  for (auto& p : pm_.params) p.tensor.mutable_grad() = at::Tensor();
  grad_ = mesh_.shape().dp > 1 ? mesh_.dp().reduce_scatter(flat, 0) : flat;

  // Each dp rank holds a different part of the summed gradient: dp adds up
  // too, unlike global_grad_norm where dp replicas are identical.
  at::Tensor sq = (grad_.to(at::kDouble).pow(2) * norm_mask_).sum().reshape({1});
  if (mesh_.shape().dp > 1) mesh_.dp().all_reduce(sq);
  if (mesh_.shape().tp > 1) mesh_.tp().all_reduce(sq);
  if (mesh_.shape().pp > 1) mesh_.pp().all_reduce(sq);
  return sq.sqrt().squeeze(0);
}

void ZeroOptimizer::scale_gradients(const at::Tensor& scale) {
  at::NoGradGuard no_grad;
  grad_.mul_(scale);
}

void ZeroOptimizer::step(double lr, const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params;
  for (const auto& p : pm_.params) params.push_back(p.tensor.detach());
  at::Tensor param = owned_slice(params);

  // AdamW's fused update over the owned slice, cut into the runs of
  // parameters with and without weight decay (two groups, as AdamW::step).
  std::vector<at::Tensor> p[2], g[2], m[2], v[2];
  for (const auto& [lo, hi, decay] : runs_) {
    const int i = decay ? 1 : 0;
    p[i].push_back(param.narrow(0, lo, hi - lo));
    g[i].push_back(grad_.narrow(0, lo, hi - lo));
    m[i].push_back(exp_avg_.narrow(0, lo, hi - lo));
    v[i].push_back(exp_avg_sq_.narrow(0, lo, hi - lo));
  }
  step_t_.add_(1);
  for (int i = 0; i < 2; ++i)
    fused_adamw(p[i], g[i], m[i], v[i], step_t_, lr, cfg_, i == 1 ? cfg_.weight_decay : 0.0, found_inf);
  if (found_inf.defined()) step_t_.sub_(found_inf);

  at::Tensor all = mesh_.shape().dp > 1 ? mesh_.dp().all_gather(param, 0) : param;
  const auto updated = unflatten(all);
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    at::Tensor t = pm_.params[i].tensor.detach();
    t.copy_(updated[i].to(t.scalar_type()));
  }
}

int64_t ZeroOptimizer::steps_taken() const { return static_cast<int64_t>(step_t_.item<float>()); }

void ZeroOptimizer::set_steps_taken(int64_t s) {
  at::NoGradGuard no_grad;
  step_t_.fill_(static_cast<double>(s));
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> ZeroOptimizer::gather_moments() {
  at::NoGradGuard no_grad;
  const bool many = mesh_.shape().dp > 1;
  at::Tensor m = many ? mesh_.dp().all_gather(exp_avg_, 0) : exp_avg_.clone();
  at::Tensor v = many ? mesh_.dp().all_gather(exp_avg_sq_, 0) : exp_avg_sq_.clone();
  return {unflatten(m), unflatten(v)};
}

void ZeroOptimizer::load_moments(const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq) {
  at::NoGradGuard no_grad;
  MT_CHECK(exp_avg.size() == pm_.params.size() && exp_avg_sq.size() == pm_.params.size(),
           "zero_stage 1: moments for ", exp_avg.size(), " parameters, this rank has ", pm_.params.size());
  exp_avg_.copy_(owned_slice(exp_avg));
  exp_avg_sq_.copy_(owned_slice(exp_avg_sq));
}

}  // namespace meshtrain
