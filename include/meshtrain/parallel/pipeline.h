#pragma once
// Runs the forward and backward passes of one accumulation round over this
// rank's microbatches. With pp == 1 it is a plain loop; with pp > 1 the
// activations travel between stages (gpipe or 1f1b, see the schedule files).
#include <ATen/core/Tensor.h>

#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

// Sums over the microbatches this rank computed (non-zero on the last stage only).
struct RoundSums {
  double ce_sum = 0;        // sum of token cross-entropies
  double tokens = 0;        // tokens counted in ce_sum
  double aux_sum = 0;       // sum over sequences of the per-sequence aux loss (all MoE layers)
  double z_sum = 0;
  double dropped = 0, assigned = 0;            // MoE token-assignments (this rank's layers)
  std::vector<std::vector<double>> expert_tokens;  // per local MoE layer, per expert
  int64_t peak_live_microbatches = 0;          // activations held at once (schedule tests)
  double wait_seconds = 0;                     // blocked in pipeline send/recv (bubble measurement)
};

struct RoundSpec {
  double ce_scale = 1.0;    // multiplies the ce sum in the backward loss (1 / global tokens of the step)
  double aux_scale = 0.0;   // multiplies the per-sequence aux sum (alpha / global sequences of the step)
  double z_scale = 0.0;
  bool backward = true;     // false: evaluation (no grad)
};

// inputs/targets: this dp rank's share [B_local, T] (on every stage; only the
// first stage reads inputs and only the last reads targets).
RoundSums run_round(ParallelModel& pm, Mesh& mesh, const Config& cfg, const at::Tensor& inputs,
                    const at::Tensor& targets, const RoundSpec& spec);

}  // namespace meshtrain
