// The sums every strategy shares (see gradient_sums.h).
#include "gradient_sums.h"

#include <torch/torch.h>

#include <numeric>

#include "meshtrain/core/check.h"
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

void sum_partial_gradients(ParallelModel& pm, Mesh& mesh, const std::vector<size_t>& params) {
  at::NoGradGuard no_grad;
  // Non-trainable state (the router's selection bias) never has a gradient.
  for (size_t i : params) {
    ParamInfo& p = pm.params[i];
    if (p.tensor.requires_grad() && !p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
  }
  if (mesh.shape().tp > 1) {
    std::vector<at::Tensor> sp;
    for (size_t i : params)
      if (pm.params[i].sequence_parallel_grad && pm.params[i].tensor.grad().defined())
        sp.push_back(pm.params[i].tensor.grad());
    all_reduce_flat(sp, mesh.tp());
  }
  // zbv's V holds the embedding and the head on stage 0: one tensor, no copy.
  const ModelConfig& config = pm.model->config();
  if (mesh.shape().pp > 1 && (config.tie_embeddings || config.mtp_depth > 0) && !pm.model->range().v_shape) {
    // The embedding (first stage) and its copy on the last stage (the tied
    // head's weight, the multi-token prediction modules' embedding) are one
    // parameter: both take the sum of the two gradients. Stages in between
    // contribute zeros so the collective is uniform over the pp group.
    at::Tensor g;
    for (size_t i : params)
      if (pm.params[i].layout.tied_embedding) g = pm.params[i].tensor.grad();
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
}

at::Tensor global_norm(at::Tensor sum_sq, Mesh& mesh, bool sharded_over_dp) {
  if (sharded_over_dp && mesh.shape().dp > 1) mesh.dp().all_reduce(sum_sq);
  if (mesh.shape().tp > 1) mesh.tp().all_reduce(sum_sq);
  if (mesh.shape().pp > 1) mesh.pp().all_reduce(sum_sq);
  return sum_sq.sqrt().squeeze(0);
}

std::vector<size_t> all_params(const ParallelModel& pm) {
  std::vector<size_t> v(pm.params.size());
  std::iota(v.begin(), v.end(), size_t{0});
  return v;
}

}  // namespace meshtrain
