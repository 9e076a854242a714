#include "meshtrain/parallel/zero.h"

#include <torch/torch.h>

#include <cmath>

#include "meshtrain/core/check.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/checkpoint_writer.h"
#include "meshtrain/parallel/flat_slices.h"
#include "gradient_sums.h"

namespace meshtrain {

ZeroDataParallel::ZeroDataParallel(ParallelModel& pm, Mesh& mesh, const LrConfig& cfg, at::ScalarType state_dtype)
    : pm_(pm), mesh_(mesh), cfg_(cfg), state_dtype_(state_dtype) {
  MT_CHECK(!pm.params.empty(), "zero_stage 1: this rank has no parameters");
  const bool ep = mesh.shape().ep > 1;
  Group dense, experts;
  for (size_t i = 0; i < pm.params.size(); ++i)
    (ep && pm.params[i].layout.expert_split ? experts : dense).params.push_back(i);
  init_group(dense, mesh.dp(), mesh.coord().dp, mesh.shape().dp);
  groups_.push_back(std::move(dense));
  if (!experts.params.empty()) {
    init_group(experts, mesh.expert_dp(), mesh.coord().dp / mesh.shape().ep, mesh.shape().dp / mesh.shape().ep);
    groups_.push_back(std::move(experts));
  }
  std::vector<const SliceRuns*> runs;
  std::vector<at::Tensor> m, v;
  for (const Group& g : groups_) {
    runs.push_back(&g.slices);
    m.push_back(g.exp_avg);
    v.push_back(g.exp_avg_sq);
  }
  opt_ = std::make_unique<AdamW>(slice_slots(runs, m, v), cfg, pm.params.front().tensor.device());
}

void ZeroDataParallel::init_group(Group& g, Communicator& comm, int rank, int size) {
  g.comm = &comm;
  int64_t total = 0;
  for (size_t i : g.params) {
    g.offsets.push_back(total);
    total += pm_.params[i].tensor.numel();
  }
  g.padded = (total + size - 1) / size * size;
  g.slice = g.padded / size;
  g.begin = rank * g.slice;
  const auto opts = pm_.params.front().tensor.options().dtype(at::kFloat).requires_grad(false);
  g.exp_avg = at::zeros({g.slice}, opts.dtype(state_dtype_));
  g.exp_avg_sq = at::zeros({g.slice}, opts.dtype(state_dtype_));
  g.grad = at::zeros({g.slice}, opts);
  g.slices = slice_runs(pm_, mesh_, g.params, g.offsets, g.begin, g.slice);
}

at::Tensor ZeroDataParallel::flat_of(const Group& g, const std::vector<at::Tensor>& per_param) const {
  at::Tensor flat = at::zeros({g.padded}, g.grad.options());
  for (size_t j = 0; j < g.params.size(); ++j) {
    const size_t i = g.params[j];
    if (!per_param[i].defined()) continue;
    const int64_t n = pm_.params[i].tensor.numel();
    MT_CHECK(per_param[i].numel() == n, "zero_stage 1: tensor for parameter '", pm_.params[i].layout.global_name,
             "' has ", per_param[i].numel(), " elements, expected ", n);
    flat.narrow(0, g.offsets[j], n).copy_(per_param[i].reshape({-1}));
  }
  return flat;
}

at::Tensor ZeroDataParallel::owned_slice(const Group& g, const std::vector<at::Tensor>& per_param) const {
  return slice_of(pm_, g.params, g.offsets, g.begin, g.slice, per_param, g.grad.options());
}

void ZeroDataParallel::unflatten(const Group& g, const at::Tensor& flat, std::vector<at::Tensor>& out) const {
  meshtrain::unflatten(pm_, g.params, g.offsets, flat, out);
}

void ZeroDataParallel::reduce() {
  at::NoGradGuard no_grad;
  sum_partial_gradients(pm_, mesh_, all_params(pm_));
  std::vector<at::Tensor> grads;
  for (const auto& p : pm_.params) grads.push_back(p.tensor.grad());
  std::vector<at::Tensor> flats;
  for (const Group& g : groups_) flats.push_back(flat_of(g, grads));
  grads.clear();
  // The full gradients are no longer needed: free them before the collective.
  for (auto& p : pm_.params) p.tensor.mutable_grad() = at::Tensor();
  for (size_t k = 0; k < groups_.size(); ++k) {
    Group& g = groups_[k];
    g.grad = g.comm->size() > 1 ? g.comm->reduce_scatter(flats[k], 0) : flats[k];
  }
}

at::Tensor ZeroDataParallel::grad_norm() {
  at::NoGradGuard no_grad;
  at::Tensor sq;
  for (const Group& g : groups_) {
    const at::Tensor part = (g.grad.to(at::kDouble).pow(2) * g.slices.norm_mask).sum().reshape({1});
    sq = sq.defined() ? sq + part : part;
  }
  // Each dp rank holds a different part of the summed gradient: dp adds up
  // too, unlike the replicated strategy's norm where dp replicas are
  // identical. (The expert slices partition each ep rank's experts over
  // expert_dp, and the ep ranks hold different experts: summing over dp
  // counts every element once.)
  return global_norm(sq, mesh_, /*sharded_over_dp=*/true);
}

void ZeroDataParallel::update(const LearningRate& lr, const at::Tensor& found_inf, const at::Tensor& grad_scale) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params;
  for (const auto& p : pm_.params) params.push_back(p.tensor.detach());
  std::vector<at::Tensor> owned, grads;
  std::vector<const SliceRuns*> runs;
  for (const Group& g : groups_) {
    owned.push_back(owned_slice(g, params));
    grads.push_back(g.grad);
    runs.push_back(&g.slices);
  }
  opt_->step(slice_run_views(runs, owned), slice_run_views(runs, grads), lr, found_inf, grad_scale);

  std::vector<at::Tensor> updated(pm_.params.size());
  for (size_t k = 0; k < groups_.size(); ++k) {
    Group& g = groups_[k];
    const at::Tensor all = g.comm->size() > 1 ? g.comm->all_gather(owned[k], 0) : owned[k];
    unflatten(g, all, updated);
  }
  for (size_t i = 0; i < pm_.params.size(); ++i) {
    at::Tensor t = pm_.params[i].tensor.detach();
    t.copy_(updated[i].to(t.scalar_type()));
  }
}

int64_t ZeroDataParallel::steps_taken() const { return opt_->steps_taken(); }

void ZeroDataParallel::set_steps_taken(int64_t s) { opt_->set_steps_taken(s); }

int64_t ZeroDataParallel::state_numel() const {
  int64_t n = 0;
  for (const Group& g : groups_) n += g.exp_avg.numel() + g.exp_avg_sq.numel();
  return n;
}

ResidentBytes ZeroDataParallel::resident_bytes() const {
  ResidentBytes b = parameter_bytes(pm_);
  for (const Group& g : groups_) {
    b.grads += static_cast<int64_t>(g.grad.nbytes());
    b.optimizer += static_cast<int64_t>(g.exp_avg.nbytes() + g.exp_avg_sq.nbytes());
  }
  return b;
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> ZeroDataParallel::moments_to_save(HostCopies& host) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> m(pm_.params.size()), v(pm_.params.size());
  for (Group& g : groups_) {
    std::vector<bool> written;
    for (size_t i : g.params) written.push_back(group_writes_checkpoint(pm_.params[i].layout, mesh_));
    gather_to_writer(pm_, g.params, g.offsets, written, g.exp_avg, *g.comm, /*in_param_dtype=*/false, host, m);
    gather_to_writer(pm_, g.params, g.offsets, written, g.exp_avg_sq, *g.comm, /*in_param_dtype=*/false, host, v);
  }
  return {m, v};
}

void ZeroDataParallel::load_moments(const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq) {
  at::NoGradGuard no_grad;
  MT_CHECK(exp_avg.size() == pm_.params.size() && exp_avg_sq.size() == pm_.params.size(),
           "zero_stage 1: moments for ", exp_avg.size(), " parameters, this rank has ", pm_.params.size());
  for (Group& g : groups_) {
    g.exp_avg.copy_(owned_slice(g, exp_avg));
    g.exp_avg_sq.copy_(owned_slice(g, exp_avg_sq));
  }
}

}  // namespace meshtrain
