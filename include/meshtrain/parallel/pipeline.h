#pragma once
// Runs the forward and backward passes of one accumulation round over this
// rank's microbatches. With pp == 1 it is a plain loop; with pp > 1 the
// activations travel between stages (gpipe or 1f1b, see the schedule files).
#include <ATen/core/Tensor.h>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/microbatch.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

// inputs/targets: this dp rank's share [B_local, T] (on every stage; only the
// first stage reads inputs and only the last reads targets), whole sequences
// also under context parallelism (each cp rank keeps its chunks). host_inputs:
// the same inputs on the host, where token layouts are built from
// (parallel/context_parallel.h); undefined: read from inputs (a device sync
// on CUDA, when layouts are needed).
RoundSums run_round(ParallelModel& pm, Mesh& mesh, const Config& cfg, const at::Tensor& inputs,
                    const at::Tensor& targets, const RoundSpec& spec, const at::Tensor& host_inputs = {});

}  // namespace meshtrain
