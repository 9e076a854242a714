// The choice of the data-parallel strategy (see data_parallel.h).
#include "meshtrain/parallel/data_parallel.h"

#include <torch/torch.h>

#include <set>

#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/parallel/zero.h"
#include "strategies.h"

namespace meshtrain {

ResidentBytes parameter_bytes(const ParallelModel& pm) {
  ResidentBytes b;
  std::set<const void*> seen;
  for (const ParamInfo& p : pm.params) {
    if (seen.insert(p.tensor.storage().unsafeGetStorageImpl()).second)
      b.params += static_cast<int64_t>(p.tensor.storage().nbytes());
    if (p.tensor.grad().defined()) b.grads += static_cast<int64_t>(p.tensor.grad().nbytes());
  }
  return b;
}

std::unique_ptr<DataParallel> make_data_parallel(ParallelModel& pm, Mesh& mesh, const Config& cfg) {
  const int64_t stage = cfg.zero_stage_on(mesh.shape().dp);
  if (cfg.zero_stage > 0 && stage == 0)
    spdlog::info("zero_stage {}: nothing to shard with dp 1, runs as zero_stage 0", cfg.zero_stage);
  // The start-up line "precision: ..." says fp32 optimizer state: not so here.
  if (state_dtype(cfg) != at::kFloat) {
    spdlog::info("optimizer: AdamW moments kept in bf16 (optimizer_state_dtype), updated in fp32");
    // Rounding to nearest drops a change under half a bf16 step (2^-9 to 2^-8
    // of the value): one step's decay of exp_avg_sq, 1 - beta2, must exceed it.
    if (1.0 - cfg.lr.beta2 < 1.0 / 256)
      spdlog::warn("optimizer_state_dtype bfloat16 with lr.beta2 {}: exp_avg_sq's decay per step ({}) is below bf16's "
                   "rounding, so it may never decay; use beta2 <= 0.996 or float32 moments",
                   cfg.lr.beta2, 1.0 - cfg.lr.beta2);
  }
  MT_CHECK(!pm.params.empty(), "zero_stage ", stage, ": this rank has no parameters");
  // FSDP: parameters sharded (stage 3) or whole (stage 2) between layers,
  // gradients reduce-scattered per layer during backward.
  if (stage >= 2) return make_fsdp(pm, mesh, cfg, static_cast<int>(stage));
  // ZeRO-1 reduce-scatters after backward into the slices it owns.
  if (stage == 1) return std::make_unique<ZeroDataParallel>(pm, mesh, cfg.lr, state_dtype(cfg));
  // Buckets sum during backward where every dp rank's backward issues the
  // same collectives in the same order. Expert parallelism keeps the sum
  // after backward: its all-to-alls in backward span dp ranks whose graphs
  // differ (their tokens do), so a bucket could be launched before an
  // exchange on one rank and after it on another, and each would wait for
  // the other.
  const bool buckets = cfg.overlap_grad_reduce && mesh.shape().dp > 1 && mesh.shape().ep == 1;
  return make_replicated(pm, mesh, cfg, buckets);
}

}  // namespace meshtrain
