#pragma once
// Sampling through a pipeline: each stage runs its layers with its own KV
// cache, hidden states travel forward over mesh.pp(), the stage with the head
// samples and the token is broadcast back so every stage extends the same
// sequence.
#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/model/decode_step.h"

namespace meshtrain {

ForwardFn pipeline_forward(ParallelModel& pm, Mesh& mesh);
ShareFn pipeline_share(ParallelModel& pm, Mesh& mesh);

}  // namespace meshtrain
