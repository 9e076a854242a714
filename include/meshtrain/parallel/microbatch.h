#pragma once
// One accumulation round cut into microbatches, and what a round adds up:
// shared by the single-stage loop (pipeline.cpp) and the pipeline schedules
// (schedules.cpp), so a batch's route pipeline -> schedules -> pipeline_plan
// never re-enters a file.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/transformer.h"

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

  // Adds another round's (or microbatch's) sums; the peak is a maximum.
  RoundSums& operator+=(const RoundSums& o);
};

struct RoundSpec {
  double ce_scale = 1.0;    // multiplies the ce sum in the backward loss (1 / global tokens of the step)
  double aux_scale = 0.0;   // multiplies the per-sequence aux sum (alpha / global sequences of the step)
  double z_scale = 0.0;
  bool backward = true;     // false: evaluation (no grad)
};

struct Microbatch {
  at::Tensor inputs, targets;
};

std::vector<Microbatch> split_microbatches(const Config& cfg, const at::Tensor& inputs, const at::Tensor& targets);
// Adds one microbatch's MoE statistics to the round's sums.
void accumulate_aux(RoundSums& sums, const ForwardAux& aux, int64_t sequences);
// The scalar whose backward gives this microbatch's share of the step's gradient.
at::Tensor stage_loss(const at::Tensor& token_losses, const ForwardAux& aux, int64_t sequences, const RoundSpec& spec);

}  // namespace meshtrain
