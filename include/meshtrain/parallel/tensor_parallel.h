#pragma once
// The layer factory for a mesh: the single-device one when tp == 1, otherwise
// Megatron's column/row-parallel linears, vocab-parallel embedding and
// cross-entropy, with optional sequence parallelism.
#include <memory>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/model/layers.h"

namespace meshtrain {

std::unique_ptr<LayerFactory> make_layer_factory(const Config& cfg, Mesh& mesh);

}  // namespace meshtrain
