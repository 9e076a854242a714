#include "meshtrain/parallel/tensor_parallel.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"

namespace meshtrain {

std::unique_ptr<LayerFactory> make_layer_factory(const Config& cfg, Mesh& mesh) {
  MT_CHECK(mesh.shape().tp == 1, "not supported yet: n_device_axis tp=", mesh.shape().tp, " (tensor parallelism)");
  MT_CHECK(!cfg.sequence_parallel, "not supported yet: sequence_parallel");
  return std::make_unique<LayerFactory>();
}

}  // namespace meshtrain
