#pragma once
// model_config.architecture: which family's defaults the keys a file leaves
// out take (see config.h and docs/JAXFORMER.md).
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/config/config.h"

namespace meshtrain::schema {

// The file's architecture: its model_config.architecture when that is given and
// not "auto"; otherwise "jaxformer" for a file in Jaxformer's own layout
// (model_config has latent_dim, which every Jaxformer modelConfig carries, and
// neither attention nor ffn, which only meshtrain files have), else "meshtrain".
std::string resolve_architecture(const nlohmann::json& j);

// For arch "jaxformer": sets m.architecture to it and gives every architecture
// key that j's model_config does not set Jaxformer's value. For "meshtrain"
// nothing changes (m.architecture keeps what the file said, "auto" if nothing).
void apply_architecture(const nlohmann::json& j, const std::string& arch, ModelConfig& m);

}  // namespace meshtrain::schema
