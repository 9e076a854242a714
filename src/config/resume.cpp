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

// What a model's keys mean, in one spelling. A config written out by
// --init-from-hf (model_config_from_hf) spells out values a config file
// leaves at a default ("mlp_hidden": 256 where the file has 0, meaning 4 * d)
// and groups its layers otherwise (blocks 1 x 4 against 2 x 2): the same
// model, refused as "different" when compared as written. So each key at a
// "0: derived" default takes the value it resolves to, keys the model does
// not use (an MHA model's MLA keys, a dense model's MoE keys) take their
// defaults, and `architecture`, which only fills the other keys, is left out
// (the layers' grouping into blocks: compare_meanings).
ModelConfig meaning(ModelConfig m) {
  const ModelConfig d;
  m.architecture = d.architecture;
  m.mlp_hidden = m.hidden_dim();
  m.n_kv_head = m.kv_heads();
  m.dense_mlp_hidden = m.dense_hidden_dim();
  const bool mla = m.attention == AttentionKind::Mla, moe = m.ffn == FfnKind::Moe;
  if (!mla) {
    m.latent_dim = d.latent_dim, m.dhR = d.dhR, m.mla_rope_input = d.mla_rope_input;
    m.mla_latent_norm = d.mla_latent_norm, m.mla_last_layer_no_rope = d.mla_last_layer_no_rope;
  }
  if (!moe) {
    m.k = d.k, m.n_experts = d.n_experts, m.n_shared = d.n_shared, m.router_score = d.router_score;
    m.moe_layers = d.moe_layers, m.shared_expert = d.shared_expert, m.router_bias = d.router_bias;
    m.router_bias_update_rate = d.router_bias_update_rate, m.routed_scaling_factor = d.routed_scaling_factor;
    m.n_group = d.n_group, m.topk_group = d.topk_group, m.first_k_dense = d.first_k_dense;
    m.dense_mlp_hidden = d.dense_mlp_hidden;
  }
  return m;
}

// Blocks decide which layers are MoE (last_in_block) and which drop MLA's rope;
// elsewhere only their product, the layer count, shapes the model.
bool blocks_matter(const ModelConfig& m) {
  return (m.ffn == FfnKind::Moe && m.moe_layers == MoeLayers::LastInBlock) ||
         (m.attention == AttentionKind::Mla && m.mla_last_layer_no_rope);
}

// The model_config sections of saved and now as they mean, or saved as
// written when this build cannot read it.
void compare_meanings(nlohmann::json& saved, nlohmann::json& current, const Config& now) {
  if (!saved.contains("model_config") || !saved["model_config"].is_object()) return;
  try {
    Config was = config_from_json(saved);
    was.model = meaning(was.model);
    Config is = now;
    is.model = meaning(is.model);
    // The same layers grouped otherwise: shown as they were saved, so a real
    // change still names the key the user changed.
    if (!blocks_matter(was.model) && !blocks_matter(is.model) && was.model.n_layers() == is.model.n_layers())
      is.model.blocks = was.model.blocks, is.model.layers_per_block = was.model.layers_per_block;
    saved["model_config"] = to_json(was)["model_config"];
    current["model_config"] = to_json(is)["model_config"];
  } catch (const std::exception&) {
    // An older or damaged config: compared key by key as written.
  }
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
      "model_config.fp8_recipe",  // the GEMMs' precision: the master weights are fp32 either way
      "model_config.init_std",    "model_config.capacity_factor", "model_config.router_z_loss",
      "model_config.active_params_scope",  // what plan counts as active, not the model
      "model_config.mtp_loss_weight",
      // A run may add multi-token prediction modules to a model trained
      // without them (train/components.cpp starts them from their init).
      "model_config.mtp_depth"};
  return keys;
}

const std::vector<std::string>& resumable_keys() {
  static const std::vector<std::string> keys = {
      // how long and how fast
      "training_steps", "lr.*", "grad_clip_norm", "max_nan_skips", "stop_check_steps",
      // batches and the mesh (checkpoints reshard on load)
      "data_config.train_batch_size", "data_config.val_batch_size", "data_config.micro_batch_size", "grad_step",
      "rampup_batch_size", "device_config.*", "zero_stage", "fsdp_keep_gathered", "pipeline_schedule", "virtual_stages",
      "pipeline_pass_costs",
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

ResumeChange resume_change(const std::string& path) {
  if (listed(resumable_keys(), path)) return ResumeChange::Free;
  if (listed(model_shaping_keys(), path) && !listed(model_tuning_keys(), path)) return ResumeChange::Refused;
  return ResumeChange::Warned;
}

ResumeDiff compare_for_resume(const json& saved_as_written, const Config& now) {
  ResumeDiff diff;
  if (!saved_as_written.is_object()) return diff;
  json saved = saved_as_written, current = to_json(now);
  compare_meanings(saved, current, now);
  for (const auto& [key, value] : current.items()) {
    if (!saved.contains(key)) continue;
    const auto compare = [&](const std::string& path, const json& was, const json& is) {
      const ResumeChange change = resume_change(path);
      if (was == is || change == ResumeChange::Free) return;
      // 4 and 4.0 are the same number.
      if (was.is_number() && is.is_number() && was.get<double>() == is.get<double>()) return;
      const std::string line = path + ": " + shown(was) + " in the checkpoint, " + shown(is) + " now";
      (change == ResumeChange::Refused ? diff.refused : diff.warned).push_back(line);
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
