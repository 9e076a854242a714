#pragma once
// What config_test and config_errors_test share: tiny.json with overrides,
// the refusal checks, and every key with a fixed set of values.
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"

namespace meshtrain::config_test {

using nlohmann::json;

inline std::string source_path(const std::string& rel) { return std::string(MT_SOURCE_DIR) + "/" + rel; }

// Runs fn, expects a meshtrain::Error whose message holds every one of parts.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "no error thrown; expected one mentioning '" << parts.front() << "'";
}

inline json tiny_json() {
  std::ifstream in(source_path("configs/tiny.json"));
  return json::parse(in);
}

// tiny.json with the overrides, converted and validated.
inline Config with(const std::vector<std::string>& sets) {
  json j = tiny_json();
  for (const auto& s : sets) apply_override(j, s);
  Config c = config_from_json(j);
  validate(c);
  return c;
}

inline void expect_refused(const std::vector<std::string>& sets, const std::vector<std::string>& parts) {
  SCOPED_TRACE(sets.back());
  expect_error([&] { with(sets); }, parts);
}

// Every key with a fixed set of values, with its values as config files and
// the config a checkpoint stores spell them.
inline const std::vector<std::pair<std::string, std::vector<std::string>>> kChoiceKeys = {
    {"model_config.model_dtype", {"float32", "bfloat16"}},
    {"model_config.fp8_recipe", {"none", "tensorwise", "rowwise", "blockwise"}},
    {"model_config.attention", {"mha", "mla"}},
    {"model_config.ffn", {"dense", "moe"}},
    {"model_config.router_score", {"softmax", "sigmoid"}},
    {"model_config.architecture", {"auto", "meshtrain", "jaxformer"}},
    {"model_config.mla_rope_input", {"split", "joint_latent"}},
    {"model_config.moe_layers", {"all", "last_in_block"}},
    {"model_config.shared_expert", {"mlp", "linear", "linear_discarded"}},
    {"model_config.active_params_scope", {"model", "layers"}},
    {"model_config.mlp_activation", {"gelu", "swiglu"}},
    {"data_config.format", {"llmc", "nanogpt"}},
    {"device_config.device", {"auto", "cpu", "cuda"}},
    {"device_config.collectives", {"auto", "nccl", "mpi"}},
    {"device_config.attention_backend", {"auto", "cudnn", "flash", "efficient", "math"}},
    {"pipeline_schedule", {"gpipe", "1f1b", "interleaved", "zb-h1", "zbv"}},
    {"activation_checkpointing", {"none", "full", "selective"}},
    {"nan_policy", {"skip", "stop"}},
    {"optimizer_state_dtype", {"float32", "bfloat16"}},
};

}  // namespace meshtrain::config_test
