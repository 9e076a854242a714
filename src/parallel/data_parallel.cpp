#include "meshtrain/parallel/data_parallel.h"

#include <torch/torch.h>

#include <cmath>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/grad_buckets.h"
#include "vocab_parallel.h"

namespace meshtrain {

void all_reduce_flat(std::vector<at::Tensor>& tensors, Communicator& comm, int64_t bucket_bytes) {
  if (comm.size() == 1 || tensors.empty()) return;
  // Group same-dtype tensors into flat buckets: one collective per bucket
  // instead of one per parameter (latency dominates small tensors).
  size_t i = 0;
  while (i < tensors.size()) {
    std::vector<at::Tensor> bucket;
    int64_t bytes = 0;
    const auto dtype = tensors[i].scalar_type();
    while (i < tensors.size() && tensors[i].scalar_type() == dtype &&
           (bucket.empty() || bytes + static_cast<int64_t>(tensors[i].nbytes()) <= bucket_bytes)) {
      bytes += static_cast<int64_t>(tensors[i].nbytes());
      bucket.push_back(tensors[i++]);
    }
    std::vector<at::Tensor> flat_parts;
    for (auto& t : bucket) flat_parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    comm.all_reduce(flat);
    int64_t offset = 0;
    for (auto& t : bucket) {
      const int64_t n = t.numel();
      t.copy_(flat.narrow(0, offset, n).view_as(t));
      offset += n;
    }
  }
}

void synchronize_gradients(ParallelModel& pm, Mesh& mesh, bool dp) {
  at::NoGradGuard no_grad;
  // The buckets launched during backward are waited for, the rest launched
  // now (parallel/grad_buckets.h): before anything below reads a gradient.
  if (pm.grad_buckets) pm.grad_buckets->finish();
  // Parameters whose gradient never materialised (e.g. an expert that got no
  // token) still take part, so every rank reaches the same collectives.
  // FSDP reduced its layers' gradients during backward (parallel/fsdp.h);
  // non-trainable state (the router's selection bias) never has one.
  for (auto& p : pm.params)
    if (!p.fsdp_reduced && p.tensor.requires_grad() && !p.tensor.grad().defined())
      p.tensor.mutable_grad() = at::zeros_like(p.tensor);

  if (mesh.shape().tp > 1) {
    std::vector<at::Tensor> sp;
    for (auto& p : pm.params)
      if (p.sequence_parallel_grad && !p.fsdp_reduced && p.tensor.grad().defined()) sp.push_back(p.tensor.grad());
    all_reduce_flat(sp, mesh.tp());
  }
  if (mesh.shape().pp > 1 && pm.model->config().tie_embeddings) {
    // The embedding (first stage) and the head copy (last stage) are one
    // parameter: both take the sum of the two gradients. Stages in between
    // contribute zeros so the collective is uniform over the pp group.
    at::Tensor g;
    for (auto& p : pm.params)
      if (p.layout.global_name == "embed.weight") g = p.tensor.grad();
    // Tensors live where the parameters do: NCCL only moves device memory.
    // The table's size follows from the config (this tp rank's vocabulary
    // rows), so the stages in between need no device read to size theirs.
    const auto opts = pm.params.front().tensor.options();
    const ModelConfig& mc = pm.model->config();
    const int64_t n = vocab_range(mc.vocab_size, mesh.shape().tp, mesh.coord().tp).local * mc.model_dimension;
    MT_ASSERT(!g.defined() || g.numel() == n, "tied embedding gradient: ", g.numel(), " elements, expected ", n);
    at::Tensor buf = g.defined() ? g.clone() : at::zeros({n}, opts.dtype(at::kFloat));
    at::Tensor flat = buf.reshape({-1}).contiguous();
    mesh.pp().all_reduce(flat);
    if (g.defined()) g.copy_(flat.view_as(g));
  }
  if (dp && mesh.shape().dp > 1) {
    // Under expert parallelism a routed expert's gradient already holds the
    // tokens of its whole ep group: the sum over the ranks holding the same
    // experts (expert_dp) completes it. Without it, expert_dp() is dp.
    std::vector<at::Tensor> grads, expert_grads;
    for (auto& p : pm.params)
      if (!p.fsdp_reduced && !p.bucket_reduced && p.tensor.grad().defined())
        (p.layout.expert_split && mesh.shape().ep > 1 ? expert_grads : grads).push_back(p.tensor.grad());
    all_reduce_flat(grads, mesh.dp());
    all_reduce_flat(expert_grads, mesh.expert_dp());
  }
}

at::Tensor grad_norm(ParallelModel& pm, Mesh& mesh) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads, expert_grads;
  for (auto& p : pm.params) {
    if (!p.tensor.grad().defined()) continue;
    // Each parameter once: tp replicas only from tp rank 0, tied copies never.
    if (p.layout.tied_copy) continue;
    if (p.layout.split_dim < 0 && mesh.coord().tp != 0) continue;
    (p.layout.expert_split && mesh.shape().ep > 1 ? expert_grads : grads).push_back(p.tensor.grad());
  }
  // On the parameters' device: with NCCL the reductions below move device memory.
  const auto opts = pm.params.front().tensor.options().dtype(at::kDouble);
  const auto sum_sq = [&](const std::vector<at::Tensor>& g) {
    return g.empty() ? at::zeros({1}, opts) : at::stack(at::_foreach_norm(g, 2)).to(at::kDouble).pow(2).sum().reshape({1});
  };
  at::Tensor sq = sum_sq(grads);
  if (mesh.shape().ep > 1) {
    // Each rank of the ep group holds different experts.
    at::Tensor e = sum_sq(expert_grads);
    mesh.ep().all_reduce(e);
    sq = sq + e;
  }
  if (mesh.shape().tp > 1) mesh.tp().all_reduce(sq);
  if (mesh.shape().pp > 1) mesh.pp().all_reduce(sq);
  return sq.sqrt().squeeze(0);
}

}  // namespace meshtrain
