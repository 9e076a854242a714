#pragma once
// Before anything the config sizes is allocated, the memory plan
// (train/plan.h) is compared with the memory a rank can have: a model or a
// batch that cannot fit is refused with a message naming what takes the
// memory and the keys that set it, instead of the allocator's failure deep in
// the model's construction (a libtorch stack trace, or the kernel's OOM
// killer). The plan counts weights, gradients, AdamW's moments, FSDP's
// gathered layers and the activations of the microbatches in flight.
#include <cstdint>
#include <string>

#include "meshtrain/config/config.h"
#include "meshtrain/perf/plan.h"

namespace meshtrain {

// The memory one rank may use, and where that figure comes from (for messages).
struct MemoryBudget {
  double bytes = 0;  // <= 0: unknown, nothing is checked
  std::string source;
};

// CPU: the host's memory (its physical memory, or the cgroup's limit when
// lower) shared by the ranks on it; CUDA: the device's memory, shared by the
// ranks that drive it (ranks_on_host over visible_gpus, rounded up).
MemoryBudget rank_memory_budget(PlanDevice device, int ranks_on_host, int visible_gpus);

// Throws when the plan of cfg on `device` exceeds budget (pure: tests pass
// any budget).
void check_memory_fits(const Config& cfg, PlanDevice device, const MemoryBudget& budget);

// The largest file a checkpoint of cfg writes -- a writer rank's shard of
// the most loaded stage: fp32 weights and AdamW's two moments -- against the
// file-size limit (`ulimit -f`, limit_bytes; 0: none). Throws naming both, so
// a run is refused before MPI starts rather than at its first save.
void check_checkpoint_file_limit(const Config& cfg, int64_t limit_bytes);

}  // namespace meshtrain
