#pragma once
// Pipeline schedules (pp > 1): gpipe and 1f1b over this rank's microbatches.
// Internal to parallel/; run_round() in pipeline.h is the entry point.
#include <vector>

#include "meshtrain/parallel/pipeline.h"

namespace meshtrain {

struct Microbatch {
  at::Tensor inputs, targets;
};

std::vector<Microbatch> split_microbatches(const Config& cfg, const at::Tensor& inputs, const at::Tensor& targets);
// Adds one microbatch's MoE statistics to the round's sums.
void accumulate_aux(RoundSums& sums, const ForwardAux& aux, int64_t sequences);
// The scalar whose backward gives this microbatch's share of the step's gradient.
at::Tensor stage_loss(const at::Tensor& token_losses, const ForwardAux& aux, int64_t sequences, const RoundSpec& spec);

RoundSums run_pipeline(ParallelModel& pm, Mesh& mesh, const Config& cfg, const std::vector<Microbatch>& mbs,
                       const RoundSpec& spec);

}  // namespace meshtrain
