#pragma once
// JSON (Jaxformer layout) + `--set a.b=v` overrides -> Config, and back.
// Every key of the file maps to the Config member of the same name:
//   model_config.*, data_config.*, lr.*, device_config.*, inference_config.*,
//   and the top-level keys (output_dir, name, seed, ...).
// Unknown keys and wrong types are errors naming the full key path; Jaxformer's
// cloud-only keys are accepted with a warning that names what replaces them.
// Jaxformer's moe1B file has no attention/ffn keys but has latent_dim: its
// model_config.architecture resolves to "jaxformer", which fills the keys it
// leaves out with Jaxformer's values (MLA + MoE, biases, ...; config.h,
// docs/JAXFORMER.md). The file as written decides, before --set overrides.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct LoadedConfig {
  Config config;
  std::vector<std::string> warnings;  // one line each, for main to log
  nlohmann::json json;                // the file as written, after the --set overrides
};

// Missing keys keep the struct defaults. Cloud-only keys (bucket_name,
// process_path, wandb, inference_config.n_devices, a gs:// output_dir) add a
// line to *warnings when it is given. Does not validate().
Config config_from_json(const nlohmann::json& j, std::vector<std::string>* warnings = nullptr);

// Every key, so config_from_json(to_json(c)) reproduces c (checkpoints store it).
nlohmann::json to_json(const Config& c);

// One `--set` assignment "model_config.n_head=4": the path must name a config
// key; the value is JSON when it parses as JSON (4, 1e-3, true, [2,1,2]) and a
// string otherwise (string keys always take the text as written).
void apply_override(nlohmann::json& j, const std::string& assignment);

// Reads the file, applies the overrides in order, converts, validates.
LoadedConfig load_config(const std::string& path, const std::vector<std::string>& sets = {});

// Static checks of values and combinations (mesh vs. heads, batches, layers);
// throws on the first problem, naming the key(s) and the reason.
void validate(const Config& c);

// The mesh must use exactly the ranks mpirun started.
void validate_world(const Config& c, int world_size);

}  // namespace meshtrain
