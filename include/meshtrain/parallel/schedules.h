#pragma once
// Pipeline schedules (pp > 1): gpipe and 1f1b over this rank's microbatches.
// Internal to parallel/; run_round() in pipeline.h is the entry point, and
// microbatch.h holds what both use (so neither file re-enters the other).
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/microbatch.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

RoundSums run_pipeline(ParallelModel& pm, Mesh& mesh, const Config& cfg, const std::vector<Microbatch>& mbs,
                       const RoundSpec& spec);

}  // namespace meshtrain
