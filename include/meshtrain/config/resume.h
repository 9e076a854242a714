#pragma once
// Resuming a checkpoint with a config other than the one it was saved with.
// Three kinds of keys:
//   model-shaping (model_config.*, but for the few that only tune training,
//     model_tuning_keys()): a change is refused, naming each key and both values;
//     otherwise a resume would load a subset of the tensors, or tensors that
//     mean something else, and train on silently.
//   resumable (resumable_keys(): steps, lr schedule, batch sizes, mesh,
//     logging, data paths, ...): may change freely.
//   any other key: the resume goes on with a warning naming it.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct ResumeDiff {
  std::vector<std::string> refused;  // "model_config.n_head: 8 in the checkpoint, 4 now"
  std::vector<std::string> warned;   // same form
};

// saved: the "config" a checkpoint stores (config/load.h to_json). Keys missing
// on either side (older or newer versions) are not compared.
ResumeDiff compare_for_resume(const nlohmann::json& saved, const Config& now);

// What a resume with a key changed does: Free, a warning naming the key, or a
// refusal naming the key and both values (compare_for_resume applies this;
// docs/config-reference.md shows it per key).
enum class ResumeChange { Free, Warned, Refused };
ResumeChange resume_change(const std::string& path);

// Dotted paths that may change on resume without a word ("lr.*" covers a section).
const std::vector<std::string>& resumable_keys();

// Dotted paths whose change is refused ("model_config.*")...
const std::vector<std::string>& model_shaping_keys();
// ... but for these, which only warn (T, dropout_rate, model_dtype, ...).
const std::vector<std::string>& model_tuning_keys();

}  // namespace meshtrain
