#include "meshtrain/config/resume.h"

#include <algorithm>

#include "meshtrain/config/load.h"

namespace meshtrain {

namespace {

using nlohmann::json;

bool listed(const std::vector<std::string>& keys, const std::string& path) {
  for (const auto& k : keys) {
    if (k == path) return true;
    // "lr.*": every key of the section.
    if (k.size() > 2 && k.compare(k.size() - 2, 2, ".*") == 0 && path.rfind(k.substr(0, k.size() - 1), 0) == 0)
      return true;
  }
  return false;
}

std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

}  // namespace

const std::vector<std::string>& model_shaping_keys() {
  // Every model key, so a key added later is refused until someone decides
  // otherwise (model_tuning_keys)...
  static const std::vector<std::string> keys = {"model_config.*"};
  return keys;
}

const std::vector<std::string>& model_tuning_keys() {
  // ... except these, which change how the model trains or runs, not its
  // parameters: a resume with them changed warns.
  static const std::vector<std::string> keys = {
      "model_config.T",           "model_config.dropout_rate",  "model_config.model_dtype",
      "model_config.init_std",    "model_config.capacity_factor", "model_config.router_z_loss",
      "model_config.active_params_scope"};  // what plan counts as active, not the model
  return keys;
}

const std::vector<std::string>& resumable_keys() {
  static const std::vector<std::string> keys = {
      // how long and how fast
      "training_steps", "lr.*", "grad_clip_norm", "max_nan_skips", "stop_check_steps",
      // batches and the mesh (checkpoints reshard on load)
      "data_config.train_batch_size", "data_config.val_batch_size", "data_config.micro_batch_size", "grad_step",
      "rampup_batch_size", "device_config.*", "zero_stage", "fsdp_keep_gathered", "pipeline_schedule", "virtual_stages",
      "sequence_parallel", "overlap_grad_reduce", "grad_bucket_mb", "optimizer_writes_casts",
      "activation_checkpointing", "torch_threads",
      // logging, evaluation, saving, sampling
      "checkpoint_steps", "eval_steps", "log_every", "sample_every", "max_to_keep", "watchdog_seconds",
      "async_checkpoint", "flight_recorder_size", "straggler_threshold",
      "inference_config.*",
      // where things are
      "output_dir", "name", "data_config.data_dir", "data_config.train_folder_name", "data_config.val_folder_name"};
  return keys;
}

ResumeDiff compare_for_resume(const json& saved, const Config& now) {
  ResumeDiff diff;
  if (!saved.is_object()) return diff;
  const json current = to_json(now);
  for (const auto& [key, value] : current.items()) {
    if (!saved.contains(key)) continue;
    const auto compare = [&](const std::string& path, const json& was, const json& is) {
      if (was == is || listed(resumable_keys(), path)) return;
      // 4 and 4.0 are the same number.
      if (was.is_number() && is.is_number() && was.get<double>() == is.get<double>()) return;
      const std::string line = path + ": " + shown(was) + " in the checkpoint, " + shown(is) + " now";
      const bool shaping = listed(model_shaping_keys(), path) && !listed(model_tuning_keys(), path);
      (shaping ? diff.refused : diff.warned).push_back(line);
    };
    if (value.is_object() && saved[key].is_object()) {
      for (const auto& [sub, v] : value.items())
        if (saved[key].contains(sub)) compare(key + "." + sub, saved[key][sub], v);
    } else {
      compare(key, saved[key], value);
    }
  }
  return diff;
}

}  // namespace meshtrain
