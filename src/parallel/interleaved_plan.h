#pragma once
// Megatron's interleaved 1F1B as step lists (the contract of pipeline_plan.h);
// internal to parallel/, pipeline_plan() is the entry point.
#include <cstdint>
#include <vector>

#include "meshtrain/parallel/pipeline_plan.h"

namespace meshtrain {

// Every stage's plan (index: stage) for pp stages of v layer chunks each.
std::vector<std::vector<PipeOp>> interleaved_plans(int pp, int64_t v, int64_t n_mb, bool backward);

}  // namespace meshtrain
