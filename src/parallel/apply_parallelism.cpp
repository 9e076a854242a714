// parallelize(): the one place parallelism is applied (see parallelize.h).
#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/fsdp.h"
#include "meshtrain/parallel/grad_buckets.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

void apply_data_parallel(ParallelModel& pm, Mesh& mesh, const Config& cfg) {
  const int64_t stage = cfg.zero_stage_on(mesh.shape().dp);
  if (stage >= 2) {
    // FSDP: parameters sharded (stage 3) or whole (stage 2) between layers,
    // gradients reduce-scattered per layer during backward.
    pm.fsdp = std::make_shared<Fsdp>(pm, mesh, static_cast<int>(stage), cfg.fsdp_keep_gathered);
    pm.model->set_layer_hooks(pm.fsdp);
    return;
  }
  // ZeRO-1 reduce-scatters after backward (its optimizer owns the slices);
  // with one dp rank there is nothing to sum. Expert parallelism keeps the sum
  // after backward: its all-to-alls in backward span dp ranks whose graphs
  // differ (their tokens do), so a bucket could be launched before an exchange
  // on one rank and after it on another, and each would wait for the other.
  if (stage == 0 && cfg.overlap_grad_reduce && mesh.shape().dp > 1 && mesh.shape().ep == 1 && !pm.params.empty())
    pm.grad_buckets = std::make_shared<GradBuckets>(pm, mesh, static_cast<int64_t>(cfg.grad_bucket_mb * (1 << 20)));
}

void parallelize(ParallelModel& pm, const Config& cfg, Mesh& mesh, const at::Device& device, bool meta) {
  // 1-3: tp through the layer factory, this rank's pipeline stage(s), and
  // activation recomputation in the blocks (activation_checkpointing).
  pm = build_parallel_model(cfg, mesh, meta);
  // 4: the device; the parameter list follows the moved tensors.
  pm.model->to(device);
  for (auto& p : pm.params) p.tensor = pm.model->named_parameters()[p.path];
  // 5: data parallelism over what this rank holds.
  apply_data_parallel(pm, mesh, cfg);
}

}  // namespace meshtrain
