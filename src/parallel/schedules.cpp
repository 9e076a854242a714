#include "meshtrain/parallel/schedules.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"

namespace meshtrain {

RoundSums run_pipeline(ParallelModel&, Mesh& mesh, const Config&, const std::vector<Microbatch>&, const RoundSpec&) {
  MT_FAIL("not supported yet: n_device_axis pp=", mesh.shape().pp, " (pipeline parallelism)");
}

}  // namespace meshtrain
