// Static checks that run before any work: a bad value or an impossible mesh
// fails here with the key's name instead of deep inside a collective.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

constexpr double kMaxWatchdogSeconds = 86400;
// Generation is bounded: a typo like max_tokens=1e9 would sample for hours.
constexpr int64_t kMaxNewTokens = 65536;
constexpr int64_t kMaxInferenceBatch = 1024;
constexpr int64_t kMaxVocab = int64_t{1} << 31;

void at_most(int64_t v, int64_t hi, const char* key, const char* why) {
  MT_CHECK(v <= hi, key, " must be <= ", hi, " (", why, "), got ", v);
}

void at_least(int64_t v, int64_t lo, const char* key) {
  MT_CHECK(v >= lo, key, " must be >= ", lo, ", got ", v);
}

void non_negative(double v, const char* key) { MT_CHECK(v >= 0, key, " must be >= 0, got ", v); }

void in_unit_interval(double v, const char* key) {
  MT_CHECK(v >= 0 && v < 1, key, " must be in [0, 1), got ", v);
}

void not_empty(const std::string& v, const char* key) { MT_CHECK(!v.empty(), key, " must not be empty"); }

// Names that become directories: a control character (a "\n" from a JSON
// escape, a NUL) would make a path no one can type.
void plain_path(const std::string& v, const char* key) {
  not_empty(v, key);
  for (size_t i = 0; i < v.size(); ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    MT_CHECK(c >= 0x20 && c != 0x7f, key, " must not contain control characters: byte 0x", "0123456789abcdef"[c >> 4],
             "0123456789abcdef"[c & 15], " at position ", i, " of \"", v, "\"");
  }
}

// A run name becomes one folder inside output_dir: a '/', "." or ".." would
// put the run elsewhere (--name ../../x) or make output_dir itself the run.
void one_folder_name(const std::string& v, const char* key) {
  plain_path(v, key);
  MT_CHECK(v.find('/') == std::string::npos && v != "." && v != "..", key, " (--", key,
           ") must be a single folder name inside output_dir (no '/', not '.' or '..'), got \"", v,
           "\"; to put runs elsewhere set output_dir");
}

void validate_model(const ModelConfig& m, const DataConfig& d) {
  at_least(m.model_dimension, 1, "model_config.model_dimension");
  at_least(m.vocab_size, 1, "model_config.vocab_size");
  // Token ids travel as int32 (batches, the loader) and uint32 (shards).
  MT_CHECK(m.vocab_size <= kMaxVocab, "model_config.vocab_size (", m.vocab_size, ") must be <= ", kMaxVocab,
           " (2^31): token ids are 32-bit integers");
  at_least(m.n_head, 1, "model_config.n_head");
  at_least(m.blocks, 1, "model_config.blocks");
  at_least(m.layers_per_block, 1, "model_config.layers_per_block");
  at_least(m.T, 1, "model_config.T");
  at_least(m.latent_dim, 0, "model_config.latent_dim");
  at_least(m.dhR, 0, "model_config.dhR");
  at_least(m.mlp_hidden, 0, "model_config.mlp_hidden");
  MT_CHECK(m.model_dimension % m.n_head == 0, "model_config.model_dimension (", m.model_dimension,
           ") must be divisible by model_config.n_head (", m.n_head, ")");
  MT_CHECK(m.head_dim() % 2 == 0, "model_config.model_dimension / model_config.n_head = ", m.head_dim(),
           " (the head dim) must be even: RoPE rotates pairs of dims");
  MT_CHECK(m.T == d.T, "model_config.T (", m.T, ") must equal data_config.T (", d.T, ")");
  in_unit_interval(m.dropout_rate, "model_config.dropout_rate");
  non_negative(m.router_z_loss, "model_config.router_z_loss");
  MT_CHECK(m.rope_theta > 0, "model_config.rope_theta must be > 0, got ", m.rope_theta);
  MT_CHECK(m.init_std > 0, "model_config.init_std must be > 0, got ", m.init_std);
  if (m.gated_mlp())
    MT_CHECK(!m.linear_bias, "model_config.mlp_activation '", choice_name(m.mlp_activation),
             "' (gated) has no biases: set linear_bias false");
  at_least(m.n_kv_head, 0, "model_config.n_kv_head");
  MT_CHECK(m.n_head % m.kv_heads() == 0, "model_config.n_head (", m.n_head,
           ") must be a multiple of model_config.n_kv_head (", m.kv_heads(), "): each kv head serves a group of heads");
  if (m.attention == AttentionKind::Mla)
    MT_CHECK(m.kv_heads() == m.n_head, "model_config.n_kv_head (", m.n_kv_head,
             ") applies to attention 'mha' only: MLA shares one latent among all heads (leave it 0)");
  else
    MT_CHECK(!m.mla_latent_norm, "model_config.mla_latent_norm needs attention 'mla'");
  if (m.mla_latent_norm)
    MT_CHECK(m.mla_rope_input == MlaRopeInput::Split, "model_config.mla_latent_norm needs mla_rope_input 'split' (DeepSeek-V3)");
  at_least(m.first_k_dense, 0, "model_config.first_k_dense");
  at_least(m.dense_mlp_hidden, 0, "model_config.dense_mlp_hidden");
  non_negative(m.router_bias_update_rate, "model_config.router_bias_update_rate");
  if (m.router_bias_update_rate > 0)
    MT_CHECK(m.router_bias, "model_config.router_bias_update_rate needs model_config.router_bias true");
  at_least(m.mtp_depth, 0, "model_config.mtp_depth");
  MT_CHECK(m.mtp_loss_weight >= 0 && m.mtp_loss_weight <= 10, "model_config.mtp_loss_weight must be in [0, 10], got ",
           m.mtp_loss_weight);

  if (m.attention == AttentionKind::Mla) {
    MT_CHECK(m.latent_dim > 0, "model_config.latent_dim must be > 0 with attention 'mla', got ", m.latent_dim);
    MT_CHECK(m.dhR % 2 == 0, "model_config.dhR must be even with attention 'mla' (RoPE rotates pairs), got ",
             m.dhR);
  }
  if (m.ffn == FfnKind::Moe) {
    MT_CHECK(m.n_experts >= 1, "model_config.n_experts must be >= 1 with ffn 'moe', got ", m.n_experts);
    MT_CHECK(m.k >= 1 && m.k <= m.n_experts, "model_config.k must be in [1, model_config.n_experts = ",
             m.n_experts, "], got ", m.k);
    at_least(m.n_shared, 0, "model_config.n_shared");
    MT_CHECK(std::isfinite(m.capacity_factor) && m.capacity_factor >= 0,
             "model_config.capacity_factor must be >= 0 (0: dropless, no token is ever dropped), got ",
             m.capacity_factor);
    MT_CHECK(m.routed_scaling_factor > 0, "model_config.routed_scaling_factor must be > 0, got ",
             m.routed_scaling_factor);
    at_least(m.n_group, 1, "model_config.n_group");
    MT_CHECK(m.n_experts % m.n_group == 0, "model_config.n_experts (", m.n_experts,
             ") must be divisible by model_config.n_group (", m.n_group, ")");
    MT_CHECK(m.topk_group >= 1 && m.topk_group <= m.n_group, "model_config.topk_group must be in [1, n_group = ",
             m.n_group, "], got ", m.topk_group);
    if (m.n_group > 1) {
      const int64_t per_group = m.n_experts / m.n_group;
      // A group's score is the sum of its two best experts (DeepSeek-V3).
      MT_CHECK(per_group >= 2, "model_config.n_group (", m.n_group, ") leaves ", per_group,
               " expert(s) per group; group-limited routing scores groups by their two best experts");
      MT_CHECK(m.k <= m.topk_group * per_group, "model_config.k (", m.k, ") exceeds the ", m.topk_group * per_group,
               " experts in topk_group (", m.topk_group, ") groups of ", per_group);
    }
    MT_CHECK(m.first_k_dense <= m.n_layers(), "model_config.first_k_dense (", m.first_k_dense,
             ") exceeds the model's ", m.n_layers(), " layers");
  } else {
    MT_CHECK(m.first_k_dense == 0, "model_config.first_k_dense (", m.first_k_dense, ") needs ffn 'moe'");
    MT_CHECK(!m.router_bias && m.n_group == 1 && m.topk_group == 1 && m.routed_scaling_factor == 1.0,
             "model_config.router_bias, routed_scaling_factor, n_group and topk_group need ffn 'moe'");
  }
}

void validate_data(const DataConfig& d) {
  plain_path(d.data_dir, "data_config.data_dir");
  not_empty(d.train_folder_name, "data_config.train_folder_name");
  not_empty(d.val_folder_name, "data_config.val_folder_name");
  for (size_t i = 0; i < d.datasets.size(); ++i) {
    const auto& ds = d.datasets[i];
    MT_CHECK(!ds.path.empty(), "data_config.datasets[", i, "].path must not be empty");
    MT_CHECK(std::isfinite(ds.weight) && ds.weight > 0, "data_config.datasets[", i, "].weight must be positive, got ",
             ds.weight);
  }
  at_least(d.T, 1, "data_config.T");
  at_least(d.train_batch_size, 1, "data_config.train_batch_size");
  at_least(d.val_batch_size, 1, "data_config.val_batch_size");
  at_least(d.micro_batch_size, 0, "data_config.micro_batch_size");
  MT_CHECK(d.eot_token >= -1, "data_config.eot_token must be a token id (>= 0) or -1 (the data's), got ", d.eot_token);
}

// Keys of two sections that must agree.
void validate_model_data(const ModelConfig& m, const DataConfig& d) {
  // No token of the data reaches vocab_size (the loader refuses one), so an
  // end-of-text id at or above it would never match: document_masking would
  // mask nothing, silently.
  MT_CHECK(d.eot_token < m.vocab_size, "data_config.eot_token (", d.eot_token, ") must be below ",
           "model_config.vocab_size (", m.vocab_size, "): no token can equal it, so document_masking would find no ",
           "document boundary (-1 takes the data's own end-of-text token)");
}

void validate_lr(const LrConfig& l) {
  non_negative(l.max_lr, "lr.max_lr");
  non_negative(l.min_lr, "lr.min_lr");
  non_negative(l.end_lr, "lr.end_lr");
  MT_CHECK(l.min_lr <= l.max_lr, "lr.min_lr (", l.min_lr, ") must be <= lr.max_lr (", l.max_lr, ")");
  MT_CHECK(l.end_lr <= l.max_lr, "lr.end_lr (", l.end_lr, ") must be <= lr.max_lr (", l.max_lr, ")");
  at_least(l.warmup_steps, 0, "lr.warmup_steps");
  at_least(l.end_steps, 0, "lr.end_steps");
  // end_steps is the schedule's whole length, warmup included: a longer warmup
  // would leave the lr at max_lr forever (no decay ever starts).
  MT_CHECK(l.warmup_steps <= l.end_steps, "lr.warmup_steps (", l.warmup_steps, ") must be <= lr.end_steps (",
           l.end_steps, "), the schedule's total length including the warmup; otherwise the lr never decays");
  in_unit_interval(l.beta1, "lr.beta1");
  in_unit_interval(l.beta2, "lr.beta2");
  MT_CHECK(l.eps > 0, "lr.eps must be > 0, got ", l.eps);
  non_negative(l.weight_decay, "lr.weight_decay");
}

// Batch-size rampup and sequence-length warmup (optim/rampup.h): every batch
// size the rampup visits must split over dp and into microbatches, and every
// length the warmup visits over tp under sequence parallelism.
void validate_warmups(const Config& c) {
  const auto& r = c.rampup_batch_size;
  const int64_t full = c.data.train_batch_size;
  if (!r.empty()) {
    MT_CHECK(r.size() == 3, "rampup_batch_size must be [start, increment, samples] or [], got ", r.size(),
             " values");
    MT_CHECK(r[0] >= 1 && r[1] >= 1 && r[2] >= 0, "rampup_batch_size [start, increment, samples] needs start >= 1, "
             "increment >= 1, samples >= 0, got [", r[0], ", ", r[1], ", ", r[2], "]");
    MT_CHECK(r[0] <= full && (full - r[0]) % r[1] == 0, "rampup_batch_size: data_config.train_batch_size (", full,
             ") minus start (", r[0], ") must be a non-negative multiple of increment (", r[1], ")");
    const int64_t dp = c.device.dp();
    const int64_t unit = dp * std::max<int64_t>(1, c.data.micro_batch_size);
    MT_CHECK(r[0] % unit == 0 && r[1] % unit == 0, "rampup_batch_size: start (", r[0], ") and increment (", r[1],
             ") must be multiples of dp * data_config.micro_batch_size = ", unit,
             " so that every batch size of the rampup splits evenly");
  }
  const auto& w = c.seq_len_warmup;
  at_least(w.total_curriculum_step, 0, "seq_len_warmup.total_curriculum_step");
  if (w.total_curriculum_step == 0) return;
  MT_CHECK(w.min_difficulty >= 1 && w.min_difficulty <= c.data.T, "seq_len_warmup.min_difficulty must be in [1, ",
           "data_config.T = ", c.data.T, "], got ", w.min_difficulty);
  at_least(w.difficulty_step, 1, "seq_len_warmup.difficulty_step");
  const int64_t tp = c.device.tp();
  if (c.sequence_parallel)
    MT_CHECK(w.min_difficulty % tp == 0 && w.difficulty_step % tp == 0, "sequence_parallel splits every sequence "
             "over tp = ", tp, ": seq_len_warmup.min_difficulty (", w.min_difficulty, ") and difficulty_step (",
             w.difficulty_step, ") must be multiples of it");
}

// The zero-bubble schedules: zbv runs two chunks a stage (the layers split
// into 2pp).
void validate_zero_bubble(const Config& c) {
  const int64_t pp = c.device.pp();
  const bool v_shape = c.pipeline_schedule == PipelineSchedule::Zbv;
  MT_CHECK(c.virtual_stages == 1 || (v_shape && c.virtual_stages == 2), "pipeline_schedule \"", c.pipeline_schedule,
           "\" runs ", v_shape ? "two layer chunks" : "one layer chunk", " a stage: leave virtual_stages at 1",
           v_shape ? " (or 2)" : "", ", got ", c.virtual_stages);
  if (pp == 1) return;  // pp 1 runs no schedule
  const int64_t layers = c.model.n_layers();
  if (v_shape)
    MT_CHECK(layers % (2 * pp) == 0, "pipeline_schedule \"zbv\": the model's ", layers,
             " layers (model_config.blocks * layers_per_block) must be a multiple of 2 * pp = ", 2 * pp,
             " (two chunks a stage, in a V)");
}

// The interleaved schedule (Megatron's conditions): the layers split evenly
// into pp * virtual_stages chunks, and every training round (each batch size
// a rampup visits) cuts into a multiple of pp microbatches.
void validate_pipeline(const Config& c) {
  const int64_t v = c.virtual_stages, pp = c.device.pp(), dp = c.device.dp();
  MT_CHECK(v >= 1, "virtual_stages must be >= 1, got ", v);
  const std::vector<double>& costs = c.pipeline_pass_costs;
  MT_CHECK(costs.empty() || costs.size() == 3, "pipeline_pass_costs must be empty (costs from the model's FLOPs) or "
           "[forward, B, W], three numbers; got ", costs.size());
  for (size_t i = 0; i < costs.size(); ++i)
    MT_CHECK(std::isfinite(costs[i]) && costs[i] > 0 && costs[i] <= 1000, "pipeline_pass_costs[", i,
             "] must be a positive pass length (at most 1000), got ", costs[i]);
  if (c.pipeline_schedule == PipelineSchedule::ZbH1 || c.pipeline_schedule == PipelineSchedule::Zbv)
    return validate_zero_bubble(c);
  MT_CHECK(v == 1 || c.pipeline_schedule == PipelineSchedule::Interleaved, "virtual_stages=", v,
           " needs pipeline_schedule \"interleaved\" (it is \"", c.pipeline_schedule, "\")");
  if (v == 1 || pp == 1) return;  // one chunk per stage is 1f1b; pp 1 runs no schedule
  const int64_t layers = c.model.n_layers();
  MT_CHECK(layers % (pp * v) == 0, "pipeline_schedule \"interleaved\": the model's ", layers,
           " layers (model_config.blocks * layers_per_block) must be a multiple of pp * virtual_stages = ", pp, " * ", v,
           " = ", pp * v);
  auto microbatches = [&](int64_t batch) {
    const int64_t share = batch / dp;
    const int64_t mb = c.data.micro_batch_size > 0 ? std::min(c.data.micro_batch_size, share) : share;
    return share / std::max<int64_t>(1, mb);
  };
  std::vector<int64_t> batches = {c.data.train_batch_size};
  const auto& r = c.rampup_batch_size;
  if (r.size() == 3 && r[1] >= 1)
    for (int64_t b = r[0]; b < c.data.train_batch_size; b += r[1]) batches.push_back(b);
  for (int64_t b : batches)
    MT_CHECK(microbatches(b) % pp == 0, "pipeline_schedule \"interleaved\" needs the microbatches per round to be a "
             "multiple of pp = ", pp, ", but a batch of ", b, " sequences over dp = ", dp,
             " in microbatches of data_config.micro_batch_size = ", c.data.micro_batch_size, " makes ",
             microbatches(b));
}

// How the model and the batches split over dp x pp x tp.
// Context parallelism cuts every sequence into 2 * cp chunks (each rank holds
// two, for equal causal work): every length a run trains or evaluates at
// must split so, and under sequence parallelism a rank's two chunks split
// again over tp.
void validate_context_parallel(const Config& c) {
  const int64_t cp = c.device.cp(), tp = c.device.tp();
  MT_CHECK(cp >= 1, "device_config.context_parallel must be >= 1, got ", cp);
  if (cp == 1) return;
  const int64_t unit = 2 * cp * (c.sequence_parallel ? tp : 1);
  const std::string why = c.sequence_parallel ? " (2 * context_parallel * tp: each rank's two chunks split over tp "
                                                "under sequence_parallel)"
                                              : " (2 * context_parallel: each rank holds two of 2 * cp chunks)";
  MT_CHECK(c.data.T % unit == 0, "device_config.context_parallel = ", cp, ": data_config.T (", c.data.T,
           ") must be divisible by ", unit, why);
  const auto& w = c.seq_len_warmup;
  if (w.total_curriculum_step > 0)
    MT_CHECK(w.min_difficulty % unit == 0 && w.difficulty_step % unit == 0, "device_config.context_parallel = ", cp,
             ": seq_len_warmup.min_difficulty (", w.min_difficulty, ") and difficulty_step (", w.difficulty_step,
             ") must be multiples of ", unit, why);
}

void validate_mesh(const Config& c) {
  const auto& a = c.device.n_device_axis;
  MT_CHECK(a[0] >= 1 && a[1] >= 1 && a[2] >= 1, "device_config.n_device_axis entries [dp, pp, tp] must be >= 1, got [",
           a[0], ", ", a[1], ", ", a[2], "]");
  MT_CHECK(!(c.device.device == DeviceChoice::Cpu && c.device.collectives == CollectivesChoice::Nccl),
           "device_config.collectives is \"nccl\" but device_config.device is \"cpu\": NCCL moves CUDA tensors "
           "only (use \"auto\" or \"mpi\")");
  const int64_t dp = c.device.dp(), pp = c.device.pp(), tp = c.device.tp();
  const auto& d = c.data;
  const auto& m = c.model;
  MT_CHECK(d.train_batch_size % dp == 0, "data_config.train_batch_size (", d.train_batch_size,
           ") must be divisible by dp = ", dp, " (device_config.n_device_axis[0])");
  MT_CHECK(d.val_batch_size % dp == 0, "data_config.val_batch_size (", d.val_batch_size,
           ") must be divisible by dp = ", dp, " (device_config.n_device_axis[0])");
  if (d.micro_batch_size > 0) {
    const int64_t share = d.train_batch_size / dp;
    MT_CHECK(share % d.micro_batch_size == 0, "data_config.micro_batch_size (", d.micro_batch_size,
             ") must divide the per-dp-rank batch data_config.train_batch_size / dp = ", d.train_batch_size, " / ",
             dp, " = ", share);
    // Evaluation runs the same microbatched schedule: fail now, not at the first evaluation after hours of training.
    const int64_t val_share = d.val_batch_size / dp;
    MT_CHECK(val_share <= d.micro_batch_size || val_share % d.micro_batch_size == 0,
             "data_config.micro_batch_size (", d.micro_batch_size, ") must divide the per-dp-rank validation batch data_config.val_batch_size / dp = ", d.val_batch_size,
             " / ", dp, " = ", val_share);
  }
  MT_CHECK(m.n_head % tp == 0, "model_config.n_head (", m.n_head, ") must be divisible by tp = ", tp,
           " (device_config.n_device_axis[2])");
  // Column-parallel MLP/expert layers split the hidden units over tp.
  MT_CHECK(m.hidden_dim() % tp == 0, "model_config.mlp_hidden: the MLP hidden size ", m.hidden_dim(),
           " must be divisible by tp = ", tp, " (device_config.n_device_axis[2])");
  MT_CHECK(m.dense_hidden_dim() % tp == 0, "model_config.dense_mlp_hidden: the dense layers' hidden size ",
           m.dense_hidden_dim(), " must be divisible by tp = ", tp, " (device_config.n_device_axis[2])");
  // Key/value heads split over tp, or (fewer heads than ranks) each rank keeps
  // the one its query heads read.
  const int64_t kv = m.kv_heads();
  MT_CHECK(kv % tp == 0 || tp % kv == 0, "model_config.n_kv_head (", kv, ") and tp = ", tp,
           " (device_config.n_device_axis[2]): one must divide the other");
  MT_CHECK(pp <= m.n_layers(), "device_config.n_device_axis: pp=", pp, " exceeds the model's ", m.n_layers(),
           " layers (model_config.blocks * model_config.layers_per_block): every stage needs a layer");
  if (c.sequence_parallel)
    MT_CHECK(m.T % tp == 0, "sequence_parallel needs model_config.T (", m.T, ") divisible by tp = ", tp);
  validate_context_parallel(c);
  const int64_t ep = c.device.expert_parallel, cp = c.device.cp();
  MT_CHECK(ep >= 1, "device_config.expert_parallel must be >= 1, got ", ep);
  MT_CHECK((dp * cp) % ep == 0, "device_config.expert_parallel (", ep, ") must divide dp = ", dp,
           cp > 1 ? " x context_parallel " + std::to_string(cp) : std::string(),
           " (device_config.n_device_axis[0]): experts are split over ranks of the dp group");
  if (ep > 1) {
    MT_CHECK(m.ffn == FfnKind::Moe, "device_config.expert_parallel = ", ep, " needs an MoE model (model_config.ffn \"moe\"), "
             "got ffn \"", m.ffn, "\"");
    MT_CHECK(m.n_experts % ep == 0, "device_config.expert_parallel (", ep, ") must divide model_config.n_experts (",
             m.n_experts, "): every rank of an ep group holds n_experts / expert_parallel experts");
  }
  validate_warmups(c);
  validate_pipeline(c);
}

// FP8 recipes (model/fp8_linear.h): on top of the bf16 policy, and only on
// meshes where every rank's scales are one process's. Blockwise scales
// 128-wide tiles and never reduces them over ranks, so no tile may straddle
// two: every dim tp splits, and under sequence parallelism the sequence shard
// a replicated layer reads, must be whole tiles per rank.
void validate_fp8(const Config& c) {
  const ModelConfig& m = c.model;
  if (m.fp8_recipe == Fp8Recipe::None) return;
  const std::string key = std::string("model_config.fp8_recipe \"") + choice_name(m.fp8_recipe) + "\"";
  MT_CHECK(m.model_dtype == ModelDtype::Bfloat16, key, " needs model_config.model_dtype \"bfloat16\" (FP8 GEMMs on "
           "top of the bf16 policy: bf16 activations, fp32 master weights), got \"", m.model_dtype, "\"");
  const int64_t tp = c.device.tp(), cp = c.device.cp(), ep = c.device.expert_parallel;
  MT_CHECK(!(cp > 1 && ep > 1), key, " with device_config.context_parallel ", cp, " and device_config.expert_parallel ",
           ep, " together is not supported: an expert's rows would mix sequence chunks of several senders, whose "
           "scales no single process computes (use one of them)");
  if (m.fp8_recipe != Fp8Recipe::Blockwise) return;
  const int64_t tile = 128;
  MT_CHECK(cp == 1, key, " with device_config.context_parallel ", cp, " is not supported: its 128-token tiles of the "
           "weight-gradient GEMMs would straddle the ranks' sequence chunks (use tensorwise or rowwise)");
  if (tp == 1) return;
  std::vector<std::pair<std::string, int64_t>> split;  // what tp splits, and its width
  const int64_t hd = m.head_dim(), kv = m.kv_heads();
  split.emplace_back("the attention heads (model_config.model_dimension)", m.n_head * hd);
  if (m.attention == AttentionKind::Mha && kv % tp == 0 && kv != m.n_head)
    split.emplace_back("the key/value heads (model_config.n_kv_head x head dim)", kv * hd);
  if (m.attention == AttentionKind::Mla && m.dhR > 0)
    split.emplace_back("the rope queries (model_config.n_head x dhR)", m.n_head * m.dhR);
  const bool dense_layers = m.ffn == FfnKind::Dense || m.first_k_dense > 0;
  if (dense_layers) split.emplace_back("the MLP hidden units (model_config.dense_mlp_hidden)", m.dense_hidden_dim());
  if (m.ffn == FfnKind::Moe) split.emplace_back("the expert hidden units (model_config.mlp_hidden)", m.hidden_dim());
  if (m.ffn == FfnKind::Moe && m.n_shared > 0 && m.shared_expert == SharedExpert::Mlp)
    split.emplace_back("the shared experts' hidden units (model_config.n_shared x mlp_hidden)", m.n_shared * m.hidden_dim());
  for (const auto& [what, width] : split)
    MT_CHECK(width % (tile * tp) == 0, key, " quantizes in 128-wide tiles, and tp = ", tp,
             " (device_config.n_device_axis[2]) splits ", what, ", ", width, " wide, into shards of ", width / tp,
             ": each shard must be a multiple of 128 so that no tile straddles two ranks (use tensorwise or rowwise, "
             "or widths that are multiples of ", tile * tp, ")");
  // Replicated layers that read the sequence shard: MLA's down-projections
  // and rope key, kv heads replicated over more tp ranks than heads.
  const bool shard_readers = m.attention == AttentionKind::Mla || kv % tp != 0;
  if (c.sequence_parallel && shard_readers)
    MT_CHECK(m.T % (tile * tp) == 0, key, " with sequence_parallel: replicated layers read a sequence shard of "
             "model_config.T / tp = ", m.T, " / ", tp, " tokens, whose weight gradients scale 128-token tiles: the shard "
             "must be a multiple of 128 (T a multiple of ", tile * tp, "), or use tensorwise or rowwise");
}

// What a captured step cannot do (device_config.cuda_graphs): each refusal
// names the key that asks for it. The graph replays one rank's kernels with
// the shapes and host decisions of its capture.
void validate_cuda_graphs(const Config& c) {
  if (!c.device.cuda_graphs) return;
  const std::string key = "device_config.cuda_graphs: ";
  const auto& a = c.device.n_device_axis;
  MT_CHECK(c.device.world() == 1, key, "the step is captured on one rank, but the mesh has ", c.device.world(),
           " (device_config.n_device_axis [", a[0], ", ", a[1], ", ", a[2], "], context_parallel ", c.device.cp(),
           "): collectives and pipeline waits are timed by the host; set cuda_graphs false for this mesh");
  MT_CHECK(c.rampup_batch_size.empty(), key, "rampup_batch_size changes the batch shape between steps; a graph ",
           "replays one shape (remove rampup_batch_size or set cuda_graphs false)");
  MT_CHECK(c.seq_len_warmup.total_curriculum_step == 0, key, "seq_len_warmup changes the sequence length between ",
           "steps; a graph replays one shape (set seq_len_warmup.total_curriculum_step 0 or cuda_graphs false)");
  MT_CHECK(c.model.ffn != FfnKind::Moe || c.model.capacity_factor > 0, key, "dropless MoE routing ",
           "(model_config.capacity_factor 0) sizes each expert's group from the data; a graph replays fixed shapes ",
           "(set a capacity_factor, e.g. 1.25, or cuda_graphs false)");
  MT_CHECK(!c.data.document_masking, key, "data_config.document_masking lays out each batch's documents on the ",
           "host, a different attention layout every step (set document_masking false or cuda_graphs false)");
  MT_CHECK(c.activation_checkpointing == ActivationCheckpointing::None, key, "activation_checkpointing \"",
           c.activation_checkpointing, "\" restores the random generators' state inside the step, which a ",
           "captured graph cannot (set activation_checkpointing \"none\" or cuda_graphs false)");
}

void validate_run(const Config& c) {
  one_folder_name(c.name, "name");
  plain_path(c.output_dir, "output_dir");
  at_least(c.training_steps, 0, "training_steps");
  at_least(c.grad_step, 1, "grad_step");
  at_least(c.checkpoint_steps, 1, "checkpoint_steps");
  at_least(c.eval_steps, 0, "eval_steps");
  at_least(c.max_to_keep, 1, "max_to_keep");
  at_least(c.log_every, 1, "log_every");
  at_least(c.sample_every, 0, "sample_every");
  at_least(c.torch_threads, 1, "torch_threads");
  non_negative(c.grad_clip_norm, "grad_clip_norm");
  non_negative(c.alpha, "alpha");
  MT_CHECK(c.zero_stage >= 0 && c.zero_stage <= 3,
           "zero_stage must be 0 (replicated), 1 (optimizer state sharded), 2 (+ gradients) or 3 (+ parameters: "
           "FSDP), got ", c.zero_stage);
  MT_CHECK(!c.fsdp_keep_gathered || c.zero_stage >= 2,
           "fsdp_keep_gathered keeps FSDP's gathered layers and whole gradients over a step: it needs zero_stage 2 "
           "or 3, got zero_stage ", c.zero_stage);
  // Above 0; at most 64 GiB keeps the byte count far inside int64.
  MT_CHECK(c.grad_bucket_mb > 0 && c.grad_bucket_mb <= 65536, "grad_bucket_mb must be in (0, 65536] MiB, got ",
           c.grad_bucket_mb);
  at_least(c.max_nan_skips, 1, "max_nan_skips");
  at_least(c.stop_check_steps, 1, "stop_check_steps");
  // A day is far beyond any step; the bound keeps the timeout's arithmetic exact.
  MT_CHECK(c.watchdog_seconds >= 0 && c.watchdog_seconds <= kMaxWatchdogSeconds, "watchdog_seconds must be in [0, ",
           kMaxWatchdogSeconds, "] seconds (0 disables the watchdog), got ", c.watchdog_seconds);
  // A million records is ~80 MB a rank: more is a typo, not a need.
  MT_CHECK(c.flight_recorder_size >= 0 && c.flight_recorder_size <= (int64_t{1} << 20),
           "flight_recorder_size must be in [0, 1048576] collectives (0 turns the flight recorder off), got ",
           c.flight_recorder_size);
  MT_CHECK(c.straggler_threshold >= 0 && c.straggler_threshold <= 100, "straggler_threshold must be in [0, 100] (a ",
           "fraction above the median step time: 0.2 names a rank 20% slower), got ", c.straggler_threshold);

  const auto& i = c.inference;
  at_least(i.batch_size, 1, "inference_config.batch_size");
  at_least(i.top_k, 0, "inference_config.top_k");
  non_negative(i.temperature, "inference_config.temperature");
  at_least(i.max_tokens, 0, "inference_config.max_tokens");
  at_least(i.min_tokens, 0, "inference_config.min_tokens");
  if (i.speculative) {
    MT_CHECK(c.model.mtp_depth >= 1, "inference_config.speculative drafts with the multi-token prediction modules: it "
             "needs model_config.mtp_depth >= 1, got ", c.model.mtp_depth);
    // Up front, not at the end-of-run sample after the training.
    MT_CHECK(c.device.pp() == 1, "inference_config.speculative runs the whole model on one stage: it needs pp 1 "
             "(device_config.n_device_axis[1]), got ", c.device.pp());
  }
  at_most(i.min_tokens, kMaxNewTokens, "inference_config.min_tokens", "new tokens per sample");
  at_most(i.max_tokens, kMaxNewTokens, "inference_config.max_tokens", "new tokens per sample");
  at_most(i.batch_size, kMaxInferenceBatch, "inference_config.batch_size", "samples at once");
}

}  // namespace

void validate(const Config& c) {
  // Value ranges first, so the combination checks below never divide by zero.
  validate_model(c.model, c.data);
  validate_data(c.data);
  validate_model_data(c.model, c.data);
  validate_lr(c.lr);
  validate_run(c);
  validate_mesh(c);
  validate_fp8(c);
  validate_cuda_graphs(c);
}

void validate_world(const Config& c, int world_size) {
  const auto& a = c.device.n_device_axis;
  const std::string cp = c.device.cp() > 1 ? " x device_config.context_parallel " + std::to_string(c.device.cp()) : "";
  MT_CHECK(c.device.world() == world_size, "device_config.n_device_axis [dp, pp, tp] = [", a[0], ", ", a[1], ", ",
           a[2], "]", cp, " = ", c.device.world(), " ranks but mpirun started ", world_size,
           " (run mpirun -np ", c.device.world(), " or change n_device_axis)");
}

}  // namespace meshtrain
