#pragma once
// One rank's compute for the step model (perf/step_model.h): GEMM and
// attention FLOPs, the bytes the other kernels move, and the kernels
// launched, per microbatch of a pipeline stage and per optimizer step.
#include <cstdint>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct Work {
  double gemm_flop = 0, attention_flop = 0, bytes = 0, kernels = 0;
  Work& operator+=(const Work& o);
};
Work scaled(const Work& w, double factor);

// A microbatch on one rank of a stage: its forward, and its backward with
// whatever recomputation the config asks for.
struct MicrobatchWork {
  Work forward, backward;
};

// Rows each token runs through the routed experts: every expert's capacity
// slots per sequence, filled or not (static shapes), or k dropless.
double expert_slots(const ModelConfig& m);

// `layers` of cfg.model on one rank of cfg's mesh (tp, cp, sequence
// parallelism, micro_batch_size, activation checkpointing); `first` / `last`:
// the stage holds the embedding / the final norm, head and loss.
MicrobatchWork stage_microbatch_work(const Config& cfg, const std::vector<int64_t>& layers, bool first, bool last);

// Once per step: the gradient norm, clipping and AdamW over the `owned`
// parameters this rank updates, plus accumulating `local` parameters'
// gradients over `microbatches` (the first writes them).
Work optimizer_work(const Config& cfg, double owned, double local, int64_t microbatches);

}  // namespace meshtrain
