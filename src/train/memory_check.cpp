#include "meshtrain/train/memory_check.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/dist/device.h"

namespace meshtrain {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", bytes / kGiB);
  return s;
}

// cgroup v2's memory.max (or v1's limit), 0 when there is none.
double cgroup_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string v;
    if (!(in >> v) || v == "max") continue;
    try {
      const double bytes = std::stod(v);
      if (bytes > 0 && bytes < 1e18) return bytes;  // v1 writes a huge number for "none"
    } catch (const std::exception&) {
    }
  }
  return 0;
}

}  // namespace

MemoryBudget rank_memory_budget(PlanDevice device, int ranks_on_host, int visible_gpus) {
  MemoryBudget b;
  const int ranks = std::max(1, ranks_on_host);
  if (device == PlanDevice::Cuda) {
    const double mem = static_cast<double>(cuda_device_memory(0));
    if (mem <= 0 || visible_gpus <= 0) return b;
    const int sharing = (ranks + visible_gpus - 1) / visible_gpus;  // collectives "mpi" lets ranks share a GPU
    b.bytes = mem / sharing;
    b.source = "the GPU's " + gib(mem) + (sharing > 1 ? " shared by " + std::to_string(sharing) + " ranks" : "");
    return b;
  }
  const double phys = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  const double limit = cgroup_limit();
  const double host = limit > 0 ? std::min(limit, phys) : phys;
  if (host <= 0) return b;
  b.bytes = host / ranks;
  b.source = "this host's " + gib(host) + (limit > 0 && limit < phys ? " (its cgroup's memory limit)" : " of memory") +
             (ranks > 1 ? " shared by its " + std::to_string(ranks) + " ranks: " + gib(b.bytes) + " each" : "");
  return b;
}

void check_memory_fits(const Config& cfg, PlanDevice device, const MemoryBudget& budget) {
  if (budget.bytes <= 0) return;
  const MemoryPlan plan = plan_memory(cfg, device);
  const StageMemory& w = plan.worst();
  if (w.total() <= budget.bytes) return;
  const ModelConfig& m = cfg.model;
  const double state = w.static_bytes() + w.gathered + w.autocast_copies;
  std::string keys;
  if (state >= w.activations) {
    keys = "the model: model_config.model_dimension " + std::to_string(m.model_dimension) + ", vocab_size " +
           std::to_string(m.vocab_size) + ", " + std::to_string(m.n_layers()) +
           " layers (blocks x layers_per_block)" +
           (m.ffn == FfnKind::Moe ? ", n_experts " + std::to_string(m.n_experts) : std::string()) + ": " +
           std::to_string(w.params.total()) + " parameters on the most loaded rank";
  } else {
    keys = "the activations: data_config.train_batch_size " + std::to_string(cfg.data.train_batch_size) +
           " (micro_batch_size " + std::to_string(cfg.data.micro_batch_size) + ") x model_config.T " +
           std::to_string(m.T) + ", activation_checkpointing \"" + std::string(choice_name(cfg.activation_checkpointing)) +
           "\"";
  }
  MT_FAIL("this config needs ", gib(w.total()), " per rank (meshtrain plan: weights, gradients and AdamW moments ",
          gib(state), ", activations ", gib(w.activations), "), more than ", budget.source,
          "; most of it is ", keys, ". Shrink those keys, or spread the run over more ranks (device_config.",
          "n_device_axis: pp and tp split the model, zero_stage shards its state over dp)");
}

void check_checkpoint_file_limit(const Config& cfg, int64_t limit_bytes) {
  if (limit_bytes <= 0) return;
  const MemoryPlan plan = plan_memory(cfg, PlanDevice::Cpu);
  const double moment = cfg.optimizer_state_dtype == ModelDtype::Bfloat16 ? 2 : 4;
  const double bytes = static_cast<double>(plan.worst().params.total()) * (4 + 2 * moment);
  MT_CHECK(bytes <= static_cast<double>(limit_bytes), "a checkpoint of this run writes files of about ",
           static_cast<int64_t>(bytes), " bytes (a rank's share of the most loaded stage: ",
           plan.worst().params.total(), " parameters, fp32 weights and AdamW's two moments), above the file-size ",
           "limit (ulimit -f) of ", limit_bytes, " bytes: every save would fail. Raise the limit (ulimit -f ",
           "unlimited), or spread the model over more ranks (pp, tp)");
}

}  // namespace meshtrain
