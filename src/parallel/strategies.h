#pragma once
// The strategies' constructors, for make_data_parallel (data_parallel.cpp).
#include <memory>

#include "meshtrain/parallel/data_parallel.h"

namespace meshtrain {

// zero_stage 0 (replicated.cpp); buckets: sum over dp during backward (grad_buckets.h).
std::unique_ptr<DataParallel> make_replicated(ParallelModel& pm, Mesh& mesh, const Config& cfg, bool buckets);
// zero_stage 2 and 3 (fsdp_data_parallel.cpp): installs the FSDP units and layer hooks.
std::unique_ptr<DataParallel> make_fsdp(ParallelModel& pm, Mesh& mesh, const Config& cfg, int stage);

}  // namespace meshtrain
