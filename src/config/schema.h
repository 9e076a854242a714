#pragma once
// The one list of config keys. Reading, writing and key lookup all walk it, so
// a member added to config.h needs exactly one line here to be loadable.
#include <array>

#include "meshtrain/config/config.h"

namespace meshtrain::schema {

inline constexpr const char* kTop = "";  // section of the top-level keys
inline constexpr std::array<const char*, 6> kSections{"model_config", "data_config", "lr",
                                                      "device_config", "inference_config", "seq_len_warmup"};

// Calls v("model_config", key, member) for every model key; M is ModelConfig
// or const ModelConfig.
template <class M, class V>
void visit_model_fields(M& m, V&& v) {
  v("model_config", "model_dimension", m.model_dimension);
  v("model_config", "vocab_size", m.vocab_size);
  v("model_config", "n_head", m.n_head);
  v("model_config", "blocks", m.blocks);
  v("model_config", "layers_per_block", m.layers_per_block);
  v("model_config", "T", m.T);
  v("model_config", "latent_dim", m.latent_dim);
  v("model_config", "dhR", m.dhR);
  v("model_config", "dropout_rate", m.dropout_rate);
  v("model_config", "model_dtype", m.model_dtype);
  v("model_config", "fp8_recipe", m.fp8_recipe);
  v("model_config", "k", m.k);
  v("model_config", "n_experts", m.n_experts);
  v("model_config", "n_shared", m.n_shared);
  v("model_config", "capacity_factor", m.capacity_factor);
  v("model_config", "attention", m.attention);
  v("model_config", "ffn", m.ffn);
  v("model_config", "tie_embeddings", m.tie_embeddings);
  v("model_config", "mlp_hidden", m.mlp_hidden);
  v("model_config", "router_score", m.router_score);
  v("model_config", "router_z_loss", m.router_z_loss);
  v("model_config", "rope_theta", m.rope_theta);
  v("model_config", "mla_last_layer_no_rope", m.mla_last_layer_no_rope);
  v("model_config", "init_std", m.init_std);
  v("model_config", "mlp_activation", m.mlp_activation);
  v("model_config", "n_kv_head", m.n_kv_head);
  v("model_config", "mla_latent_norm", m.mla_latent_norm);
  v("model_config", "router_bias", m.router_bias);
  v("model_config", "router_bias_update_rate", m.router_bias_update_rate);
  v("model_config", "routed_scaling_factor", m.routed_scaling_factor);
  v("model_config", "n_group", m.n_group);
  v("model_config", "topk_group", m.topk_group);
  v("model_config", "first_k_dense", m.first_k_dense);
  v("model_config", "dense_mlp_hidden", m.dense_mlp_hidden);
  v("model_config", "architecture", m.architecture);
  v("model_config", "linear_bias", m.linear_bias);
  v("model_config", "norm_bias", m.norm_bias);
  v("model_config", "mla_rope_input", m.mla_rope_input);
  v("model_config", "moe_layers", m.moe_layers);
  v("model_config", "shared_expert", m.shared_expert);
  v("model_config", "active_params_scope", m.active_params_scope);
  v("model_config", "mtp_depth", m.mtp_depth);
  v("model_config", "mtp_loss_weight", m.mtp_loss_weight);
}

// Calls v(section, key, member) for every key; C is Config or const Config.
template <class C, class V>
void visit_fields(C& c, V&& v) {
  visit_model_fields(c.model, v);

  auto& d = c.data;
  v("data_config", "data_dir", d.data_dir);
  v("data_config", "train_folder_name", d.train_folder_name);
  v("data_config", "val_folder_name", d.val_folder_name);
  v("data_config", "format", d.format);
  v("data_config", "datasets", d.datasets);
  v("data_config", "T", d.T);
  v("data_config", "train_batch_size", d.train_batch_size);
  v("data_config", "val_batch_size", d.val_batch_size);
  v("data_config", "micro_batch_size", d.micro_batch_size);
  v("data_config", "document_masking", d.document_masking);
  v("data_config", "eot_token", d.eot_token);

  auto& l = c.lr;
  v("lr", "max_lr", l.max_lr);
  v("lr", "min_lr", l.min_lr);
  v("lr", "end_lr", l.end_lr);
  v("lr", "warmup_steps", l.warmup_steps);
  v("lr", "end_steps", l.end_steps);
  v("lr", "beta1", l.beta1);
  v("lr", "beta2", l.beta2);
  v("lr", "eps", l.eps);
  v("lr", "weight_decay", l.weight_decay);

  v("device_config", "n_device_axis", c.device.n_device_axis);
  v("device_config", "device", c.device.device);
  v("device_config", "collectives", c.device.collectives);
  v("device_config", "expert_parallel", c.device.expert_parallel);
  v("device_config", "context_parallel", c.device.context_parallel);
  v("device_config", "attention_backend", c.device.attention_backend);
  v("device_config", "cuda_graphs", c.device.cuda_graphs);

  auto& i = c.inference;
  v("inference_config", "prompt", i.prompt);
  v("inference_config", "batch_size", i.batch_size);
  v("inference_config", "top_k", i.top_k);
  v("inference_config", "temperature", i.temperature);
  v("inference_config", "max_tokens", i.max_tokens);
  v("inference_config", "use_cache", i.use_cache);
  v("inference_config", "n_devices", i.n_devices);
  v("inference_config", "speculative", i.speculative);
  v("inference_config", "stop_at_eot", i.stop_at_eot);
  v("inference_config", "min_tokens", i.min_tokens);

  auto& w = c.seq_len_warmup;
  v("seq_len_warmup", "min_difficulty", w.min_difficulty);
  v("seq_len_warmup", "difficulty_step", w.difficulty_step);
  v("seq_len_warmup", "total_curriculum_step", w.total_curriculum_step);

  v(kTop, "output_dir", c.output_dir);
  v(kTop, "name", c.name);
  v(kTop, "training_steps", c.training_steps);
  v(kTop, "grad_step", c.grad_step);
  v(kTop, "alpha", c.alpha);
  v(kTop, "checkpoint_steps", c.checkpoint_steps);
  v(kTop, "eval_steps", c.eval_steps);
  v(kTop, "seed", c.seed);
  v(kTop, "grad_clip_norm", c.grad_clip_norm);
  v(kTop, "pipeline_schedule", c.pipeline_schedule);
  v(kTop, "virtual_stages", c.virtual_stages);
  v(kTop, "pipeline_pass_costs", c.pipeline_pass_costs);
  v(kTop, "sequence_parallel", c.sequence_parallel);
  v(kTop, "zero_stage", c.zero_stage);
  v(kTop, "fsdp_keep_gathered", c.fsdp_keep_gathered);
  v(kTop, "overlap_grad_reduce", c.overlap_grad_reduce);
  v(kTop, "optimizer_state_dtype", c.optimizer_state_dtype);
  v(kTop, "optimizer_writes_casts", c.optimizer_writes_casts);
  v(kTop, "grad_bucket_mb", c.grad_bucket_mb);
  v(kTop, "rampup_batch_size", c.rampup_batch_size);
  v(kTop, "activation_checkpointing", c.activation_checkpointing);
  v(kTop, "max_to_keep", c.max_to_keep);
  v(kTop, "nan_policy", c.nan_policy);
  v(kTop, "max_nan_skips", c.max_nan_skips);
  v(kTop, "stop_check_steps", c.stop_check_steps);
  v(kTop, "log_every", c.log_every);
  v(kTop, "sample_every", c.sample_every);
  v(kTop, "torch_threads", c.torch_threads);
  v(kTop, "watchdog_seconds", c.watchdog_seconds);
  v(kTop, "async_checkpoint", c.async_checkpoint);
  v(kTop, "flight_recorder_size", c.flight_recorder_size);
  v(kTop, "straggler_threshold", c.straggler_threshold);
}

// Jaxformer keys that only make sense on its cloud setup: accepted and ignored
// (n_devices is kept in the struct but nothing reads it).
struct CloudKey {
  const char* section;
  const char* key;
  const char* type;  // JSON type it must have: "string" | "boolean" | "integer"
  const char* replacement;
};
inline constexpr std::array<CloudKey, 4> kCloudKeys{{
    {"data_config", "bucket_name", "string", "data is read from local data_config.data_dir"},
    {"data_config", "process_path", "string",
     "shards are prepared locally by `meshtrain prepare-data` into data_config.data_dir"},
    {kTop, "wandb", "boolean", "metrics go to run_dir/metrics.jsonl and TensorBoard run_dir/tb"},
    {"inference_config", "n_devices", "integer",
     "generate runs on the ranks mpirun starts, laid out by device_config.n_device_axis"},
}};

}  // namespace meshtrain::schema
