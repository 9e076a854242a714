#pragma once
// model_config.architecture: which family's defaults the keys a file leaves
// out take (see config.h and docs/JAXFORMER.md).
#include <nlohmann/json.hpp>

#include "meshtrain/config/config.h"

namespace meshtrain::schema {

// The file's architecture, never Auto: its model_config.architecture when that
// names one other than "auto"; otherwise Jaxformer for a file in Jaxformer's own
// layout (model_config has latent_dim, which every Jaxformer modelConfig
// carries, and neither attention nor ffn, which only meshtrain files have),
// else Meshtrain. A value naming no architecture counts as not given: reading
// the key refuses it, naming the allowed values.
Architecture resolve_architecture(const nlohmann::json& j);

// For Jaxformer: sets m.architecture to it and gives every architecture key
// that j's model_config does not set Jaxformer's value. For Meshtrain nothing
// changes (m.architecture keeps what the file said, Auto if nothing).
void apply_architecture(const nlohmann::json& j, Architecture arch, ModelConfig& m);

}  // namespace meshtrain::schema
