// Parameter, memory and FLOP estimates of a config (see plan.h for the model).
#include "meshtrain/perf/plan.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/parallel/pipeline_plan.h"

namespace meshtrain {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Per token of one microbatch and one layer: stored activation elements that
// tp splits, that every tp rank keeps, and dropout-mask elements; `fused`:
// SDPA runs a flash / memory-efficient kernel (no s*s scores kept).
struct LayerActs {
  double split = 0, replicated = 0, masks = 0;
};

// cp: context parallelism's group size; a token's activations are its
// rank's, but each rank keeps the keys and values (MLA: the gathered latent
// too) of the whole sequence, cp times its own tokens'.
LayerActs layer_acts(const ModelConfig& m, int64_t i, bool fused, bool selective, double cp = 1) {
  const double d = static_cast<double>(m.model_dimension), H = static_cast<double>(m.n_head);
  const double hd = static_cast<double>(m.head_dim()), s = static_cast<double>(m.T);
  const double hidden = static_cast<double>(m.hidden_dim());
  LayerActs a;
  // Two RMSNorms keep their input and normalised input; their outputs are the
  // attention / FFN inputs (Korthikanti's LN and QKV/MLP-input terms).
  a.replicated += 2 * 2 * d + 2 * d;
  double r = 0;
  if (m.attention == AttentionKind::Mla) {
    r = static_cast<double>(mla_layer_dhR(m, i));
    a.replicated += 2 * static_cast<double>(m.latent_dim);  // latents c_kv, c_q
    if (cp > 1) a.replicated += cp * (static_cast<double>(m.latent_dim) + r);  // the gathered latent and rope key
    // Latent RMSNorms keep their input and normalised input too (as above).
    if (m.mla_latent_norm) a.replicated += 2 * 2 * static_cast<double>(m.latent_dim);
    if (r > 0 && m.mla_rope_input == MlaRopeInput::JointLatent)
      a.replicated += 2 * static_cast<double>(m.latent_dim);  // [c_kv, c_q], the rope projections' input
  }
  // q and k (with rope dims), v, SDPA's output (fused kernels keep it for
  // backward) and its merged-heads copy (wo input).
  a.split += H * (hd + r) + cp * H * (hd + r) + cp * H * hd + (fused ? 2 : 1) * H * hd;
  if (!fused && !selective) {
    a.split += H * s;                         // softmax output
    if (m.dropout_rate > 0) {
      a.split += H * s;  // dropout output
      a.masks += H * s;
    }
  }
  // Per hidden unit: gelu's input and output; swiglu's gate, silu(gate), up and product.
  const double per_hidden = m.gated_mlp() ? 4 : 2;
  if (is_moe_layer(m, i)) {
    const double k = static_cast<double>(m.k), E = static_cast<double>(m.n_experts);
    const double ns = static_cast<double>(m.n_shared);
    // Rows the experts run per token: with a capacity every expert gets C
    // slots per sequence, filled or not (static shapes); dropless, k.
    double slots = k;
    if (m.capacity_factor > 0)
      slots = E * std::ceil(m.capacity_factor * s * k / E) / s;
    a.replicated += E + slots * d + k * d;  // router probs, dispatched inputs, gated outputs
    if (m.shared_expert == SharedExpert::Mlp) {
      a.split += per_hidden * hidden * (slots + ns);
    } else {
      a.split += per_hidden * hidden * slots;
      if (m.shared_expert == SharedExpert::Linear) a.replicated += ns * d;  // the shared projection's output
    }
  } else {
    a.split += per_hidden * static_cast<double>(m.dense_hidden_dim());
  }
  if (m.dropout_rate > 0) a.masks += 2 * d;  // residual dropouts
  return a;
}

// SDPA's fused CPU kernel (flash) needs equal query/key and value head sizes
// and no dropout, else the math kernel runs; on CUDA flash or the
// memory-efficient kernel (which takes MLA's wider queries) always applies.
bool fused_attention(const ModelConfig& m, int64_t layer, PlanDevice dev) {
  if (dev == PlanDevice::Cuda) return true;
  return m.dropout_rate == 0 && (m.attention != AttentionKind::Mla || mla_layer_dhR(m, layer) == 0);
}

}  // namespace

namespace {

// Routed-expert weights of layer i in all (tp x ep) ranks: every routed tensor
// but the output biases (replicated, whole on every rank).
int64_t routed_expert_params(const ModelConfig& m, const LayerParamCount& l) {
  return l.routed > 0 ? l.routed - m.n_experts * m.model_dimension * (m.linear_bias ? 1 : 0) : 0;
}

// Layer i's parameters on one rank of tp x ep.
int64_t layer_params_per_rank(const ModelConfig& m, int64_t i, int64_t tp, int64_t ep) {
  const LayerParamCount l = layer_param_count(m, i);
  const int64_t experts = routed_expert_params(m, l);
  return (l.split - experts) / tp + experts / tp / ep + l.replicated;
}

int64_t frozen_params(const ModelConfig& m, int64_t i) {
  return m.router_bias && is_moe_layer(m, i) ? m.n_experts : 0;  // moe.score_bias
}

}  // namespace

StageParams stage_params(const ModelConfig& m, int64_t pp, int64_t tp, int64_t stage, int64_t ep, int64_t v,
                         bool v_shape) {
  MT_CHECK(pp >= 1 && tp >= 1 && stage >= 0 && stage < pp, "plan: stage ", stage, " outside pp = ", pp);
  MT_CHECK(ep >= 1, "plan: device_config.expert_parallel must be >= 1, got ", ep);
  const auto ranges = partition_stages(m.n_layers(), static_cast<int>(pp), v, v_shape);
  const StageRange& rg = ranges.at(static_cast<size_t>(stage));
  StageParams p;
  p.first_layer = rg.first_layer;
  p.end_layer = rg.end_layer;
  p.chunks = rg.chunks();
  for (int64_t i : rg.layers()) {
    const LayerParamCount l = layer_param_count(m, i);
    const int64_t experts = routed_expert_params(m, l);
    p.split += (l.split - experts) / tp + experts / tp / ep;
    p.experts += experts / tp / ep;
    p.replicated += l.replicated;
    p.frozen += frozen_params(m, i);
  }
  const int64_t vocab_local = (m.vocab_size + tp - 1) / tp;  // padded to a multiple of tp
  const int64_t table = vocab_local * m.model_dimension;
  if (rg.has_embedding) p.split += table;
  if (rg.has_head) {
    p.replicated += m.model_dimension * (m.norm_bias ? 2 : 1);  // final norm
    if (!m.tie_embeddings || !rg.has_embedding) p.split += table;  // own head, or the tied copy
    // Multi-token prediction's copy of the embedding (untied: the tied copy above serves both).
    if (m.mtp_depth > 0 && !m.tie_embeddings && !rg.has_embedding) p.split += table;
    // Multi-token prediction modules (model/mtp.h): layer n_layers + j, three
    // norms and the replicated eh_proj each; FSDP gathers them with the root.
    for (int64_t i = m.n_layers(); i < m.n_layers() + m.mtp_depth; ++i) {
      const LayerParamCount l = layer_param_count(m, i);
      const int64_t experts = routed_expert_params(m, l);
      p.split += (l.split - experts) / tp + experts / tp / ep;
      p.experts += experts / tp / ep;
      p.replicated += l.replicated + 3 * m.model_dimension * (m.norm_bias ? 2 : 1) +
                      2 * m.model_dimension * m.model_dimension + (m.linear_bias ? m.model_dimension : 0);
      p.frozen += frozen_params(m, i);
    }
  }
  return p;
}

int64_t fsdp_slice_elements(const ModelConfig& m, int64_t pp, int64_t tp, int64_t stage, int64_t dp, int64_t ep,
                            int64_t v, bool v_shape) {
  MT_CHECK(dp >= 1 && ep >= 1 && dp % ep == 0, "plan: expert_parallel ", ep, " must divide dp ", dp);
  const auto slice = [](int64_t n, int64_t size) { return (n + size - 1) / size; };
  const StageParams sp = stage_params(m, pp, tp, stage, ep, v, v_shape);
  int64_t root = sp.total(), total = 0;
  for (int64_t i :
       partition_stages(m.n_layers(), static_cast<int>(pp), v, v_shape).at(static_cast<size_t>(stage)).layers()) {
    const int64_t all = layer_params_per_rank(m, i, tp, ep);
    root -= all;
    const int64_t experts = ep > 1 ? routed_expert_params(m, layer_param_count(m, i)) / tp / ep : 0;
    total += slice(all - experts - frozen_params(m, i), dp) + slice(experts, dp / ep);
  }
  return total + slice(root, dp);
}

namespace {

// What every stage's estimate shares.
struct PlanInputs {
  bool bf16 = false;
  double e = 4;        // bytes per activation element
  double mask = 4;     // bytes per dropout-mask element
  double tokens = 0;   // per microbatch
  double rep_div = 1;  // replicated activations split over tp (sequence parallelism)
  int64_t zero = 0;    // the zero_stage that runs: dp 1 has nothing to shard, stage 0 runs
  bool keep = false;   // fsdp_keep_gathered (with zero >= 2)
  int64_t v = 1;       // layer chunks per pp rank
  bool v_shape = false;  // zbv: the chunks in a V, the head on stage 0
  double moments = 8;  // bytes of AdamW state per parameter (two fp32 moments; 4 in bf16)
};

// The mesh, the parameter counts, the precision and the microbatches: plan's
// fields before any stage.
PlanInputs plan_mesh(const Config& cfg, PlanDevice device, MemoryPlan& plan) {
  const ModelConfig& m = cfg.model;
  plan.device = device;
  plan.dp = cfg.device.dp();
  plan.pp = cfg.device.pp();
  plan.tp = cfg.device.tp();
  plan.ep = cfg.device.expert_parallel;
  plan.cp = cfg.device.cp();
  plan.zero_stage = cfg.zero_stage;
  MT_CHECK(plan.dp >= 1 && plan.pp >= 1 && plan.tp >= 1, "device_config.n_device_axis must be positive");
  const ParamCount pc = count_params(m);
  plan.total_params = pc.total;
  plan.active_params = pc.active;
  plan.embedding_params = pc.embedding;

  PlanInputs in;
  // The policy is the same on every device (model/mixed_precision.h).
  const PrecisionPolicy policy = PrecisionPolicy::from_model_dtype(m.model_dtype, m.fp8_recipe);
  in.bf16 = policy.mixed();
  in.moments = cfg.optimizer_state_dtype == ModelDtype::Bfloat16 ? 4 : 8;
  plan.precision = policy.describe() +
                   (in.moments == 4 ? "; weights 4 + grads 4 + Adam moments 4 (bf16) = 12 B/param"
                                    : "; weights 4 + grads 4 + Adam moments 8 = 16 B/param") +
                   (in.bf16 ? " (+2 transient bf16 copies)" : "");
  in.e = in.bf16 ? 2.0 : 4.0;
  in.mask = device == PlanDevice::Cuda ? 1.0 : in.e;  // CPU dropout keeps a float mask
  plan.activation_bytes_per_element = in.e;

  const int64_t share = cfg.data.train_batch_size / plan.dp;
  plan.micro_batch_size = cfg.data.micro_batch_size > 0 ? cfg.data.micro_batch_size : share;
  plan.n_microbatches = std::max<int64_t>(1, share / std::max<int64_t>(1, plan.micro_batch_size));
  in.tokens = static_cast<double>(plan.micro_batch_size * m.T / plan.cp);  // this rank's chunks
  in.rep_div = cfg.sequence_parallel ? static_cast<double>(plan.tp) : 1.0;
  in.zero = cfg.zero_stage_on(plan.dp * plan.cp);  // the cp ranks shard the state too (mesh.h)
  in.keep = cfg.fsdp_keep_gathered && in.zero >= 2;
  in.v = virtual_stages(cfg, plan.pp);
  in.v_shape = plan.pp > 1 && cfg.pipeline_schedule == PipelineSchedule::Zbv;
  plan.virtual_stages = in.v;
  if (plan.pp > 1) {
    plan.pipeline_schedule = cfg.pipeline_schedule;
    // gpipe's bubble is 1f1b's; the schedules differ in memory. The
    // zero-bubble plans' is their own timeline's, with the costs the run
    // makes them with.
    const bool zb = cfg.pipeline_schedule == PipelineSchedule::ZbH1 || in.v_shape;
    const PassCosts costs = pipeline_pass_costs(cfg);
    plan.backward_input_cost = costs.backward_input / costs.forward;
    plan.backward_weight_cost = costs.backward_weight / costs.forward;
    plan.pass_costs_given = !cfg.pipeline_pass_costs.empty();
    plan.pipeline_bubble =
        zb ? time_plans(zero_bubble_plans(in.v_shape ? ZeroBubble::V : ZeroBubble::H1, static_cast<int>(plan.pp),
                                          plan.n_microbatches, true, costs),
                        in.v, in.v_shape, costs)
                 .idle_fraction
           : pipeline_bubble_fraction(static_cast<int>(plan.pp), plan.n_microbatches, in.v);
  }
  return in;
}

// Weights, gradients and optimizer state of one stage (sm.params counted).
void plan_stage_state(const ModelConfig& m, const MemoryPlan& plan, const PlanInputs& in, StageMemory& sm) {
  const int64_t stage = in.zero;
  const int64_t replicas = plan.dp * plan.cp;  // the ranks holding the same parameters (mesh.h)
  const double zero_div = stage >= 1 ? static_cast<double>(replicas) : 1.0;
  // ZeRO-1 shards the experts' moments over the ranks holding the same experts.
  const double zero_div_experts = stage >= 1 ? static_cast<double>(replicas / plan.ep) : 1.0;
  const double n = static_cast<double>(sm.params.total());
  const double ne = static_cast<double>(sm.params.experts), nd = n - ne;
  const double frozen = static_cast<double>(sm.params.frozen), trainable = n - frozen;
  if (stage >= 2) {
    const double owned = static_cast<double>(
        fsdp_slice_elements(m, plan.pp, plan.tp, sm.stage, replicas, plan.ep, in.v, in.v_shape));
    sm.weights = stage == 3 ? 4 * (owned + frozen) : 4 * n;
    sm.grads = 4 * owned;
    sm.optimizer = in.moments * owned;
    sm.experts = (stage == 3 ? 4 * ne / zero_div_experts : 4 * ne) + (4 + in.moments) * ne / zero_div_experts;
    double largest = 0, layers = 0;
    for (const LayerSpan& c : sm.params.chunks)
      for (int64_t i = c.first; i < c.end; ++i) {
        const double l = static_cast<double>(layer_params_per_rank(m, i, plan.tp, plan.ep));
        largest = std::max(largest, l);
        layers += l;
      }
    // fsdp_keep_gathered: the layers' gradients stay whole (fp32) through the step.
    if (in.keep) sm.grads += 4 * layers;
    if (stage == 3) {
      // The root unit stays whole (fp32) through a step. Layers are gathered
      // in bf16 under mixed precision (their fp32 norms, biases and router,
      // a small part, counted at that width too): the running one and the
      // next, prefetched; fsdp_keep_gathered: all of them, through the step.
      const double w = in.bf16 ? 2.0 : 4.0;
      sm.gathered = 4 * (n - layers) + w * (in.keep ? layers : std::min(layers, 2 * largest));
    }
    // The layers read their gathered bf16 weights: casts only of the root's.
    if (in.bf16) sm.autocast_copies = 2 * (stage == 3 ? n - layers : n);
  } else {
    sm.weights = 4 * n;
    sm.grads = 4 * trainable;  // zero_stage 1: during backward, before the reduce-scatter
    // AdamW keeps moments for every parameter, the frozen ones too (zeros).
    sm.optimizer = in.moments * nd / zero_div + in.moments * ne / zero_div_experts;
    sm.experts = 4 * ne + 4 * ne + in.moments * ne / zero_div_experts;
  }
  if (in.bf16 && stage < 2) sm.autocast_copies = 2 * n;
  sm.reference_static = 2 * n + 4 * n + (4 + 8) * nd / zero_div + (4 + 8) * ne / zero_div_experts;
}

// Activations of one stage: the microbatches its schedule holds at once.
void plan_stage_activations(const Config& cfg, const MemoryPlan& plan, const PlanInputs& in, StageMemory& sm) {
  const ModelConfig& m = cfg.model;
  const double tokens = in.tokens, tp = static_cast<double>(plan.tp), rep_div = in.rep_div;
  const double d = static_cast<double>(m.model_dimension), e = in.e, mask = in.mask;
  const int64_t v = in.v, st = sm.stage;
  // The schedule's own plan says how many (microbatch, chunk) activations
  // it holds at once; a chunk's share is 1/v of the stage's layers.
  sm.microbatches_in_flight =
      plan.pp == 1 ? 1
                   : schedule_peak_live(cfg.pipeline_schedule, st, plan.pp, plan.n_microbatches, v,
                                        pipeline_pass_costs(cfg));
  const double inflight = static_cast<double>(sm.microbatches_in_flight) / static_cast<double>(v);

  double layers_none = 0, layers_sel = 0, largest_layer = 0;
  std::vector<int64_t> stage_layers;
  for (const LayerSpan& c : sm.params.chunks)
    for (int64_t i = c.first; i < c.end; ++i) stage_layers.push_back(i);
  const bool head_stage = in.v_shape ? st == 0 : st == plan.pp - 1;
  // Multi-token prediction's modules run on the head's stage, each a layer
  // n_layers + j of the model's kind (model/mtp.h), held like the stage's own.
  if (head_stage)
    for (int64_t j = 0; j < m.mtp_depth; ++j) stage_layers.push_back(m.n_layers() + j);
  for (int64_t i : stage_layers) {
    auto bytes = [&](const LayerActs& a) {
      return tokens * ((a.split / tp + a.replicated / rep_div) * e + a.masks / tp * mask);
    };
    const double cp = static_cast<double>(plan.cp);
    const double full = bytes(layer_acts(m, i, fused_attention(m, i, plan.device), false, cp));
    layers_none += full;
    layers_sel += bytes(layer_acts(m, i, fused_attention(m, i, plan.device), true, cp));
    largest_layer = std::max(largest_layer, full);
  }
  const double n_layers = static_cast<double>(stage_layers.size());
  double extra = 0;  // per microbatch, outside the layers
  if (st == 0 && m.dropout_rate > 0) extra += tokens * d / rep_div * mask;  // embedding dropout
  if (head_stage) {
    // The last chunk's forward is followed by its backward under the
    // interleaved order: one cross-entropy buffer at a time (the main
    // head's and each multi-token prediction depth's).
    const double ce_live = v > 1 ? 1.0 : inflight;
    const double depths = 1.0 + static_cast<double>(m.mtp_depth);
    sm.logits = depths * ce_live * tokens * static_cast<double>((m.vocab_size + plan.tp - 1) / plan.tp) * 4.0;
    extra += tokens * 3 * d / rep_div * e;  // final norm: input, normalised, output
    // Each module besides its layer: enorm's input and output, hnorm's
    // output, their concatenation (eh_proj's input, 2d) and head_norm's
    // input, normalised and output, as the final norm: 8d a token.
    extra += static_cast<double>(m.mtp_depth) * tokens * 8 * d / rep_div * e;
  }
  const double inputs = tokens * d / rep_div * e * n_layers;  // checkpointed layer inputs
  sm.activations_none = inflight * (layers_none + extra) + sm.logits;
  sm.activations_full = inflight * (inputs + extra) + largest_layer + sm.logits;
  if (cfg.activation_checkpointing == ActivationCheckpointing::Full)
    sm.activations = sm.activations_full;
  else if (cfg.activation_checkpointing == ActivationCheckpointing::Selective)
    sm.activations = inflight * (layers_sel + extra) + sm.logits;
  else
    sm.activations = sm.activations_none;
}

}  // namespace

double cp_exchange_bytes(const Config& cfg, const std::vector<int64_t>& layers) {
  const ModelConfig& m = cfg.model;
  const int64_t cp = cfg.device.cp(), tp = cfg.device.tp();
  if (cp == 1) return 0;
  const double e = PrecisionPolicy::from_model_dtype(m.model_dtype).mixed() ? 2.0 : 4.0;
  // Sequences per step on this rank, each of T tokens gathered.
  const double rows = static_cast<double>(cfg.data.train_batch_size / cfg.device.dp() * cfg.grad_step);
  const double tokens = rows * static_cast<double>(cfg.data.T);
  const int64_t kv = m.kv_heads(), kv_local = kv % tp == 0 ? kv / tp : 1;
  // Recomputation gathers again in backward what its segments gathered:
  // full, the attention's and the router's; selective, the router's.
  const auto ckpt = cfg.activation_checkpointing;
  const double attn_times = ckpt == ActivationCheckpointing::Full ? 3.0 : 2.0;
  const double router_times = ckpt == ActivationCheckpointing::None ? 2.0 : 3.0;
  double per_token = 0;
  for (int64_t i : layers) {
    if (m.attention == AttentionKind::Mla)
      per_token += attn_times * static_cast<double>(m.latent_dim + mla_layer_dhR(m, i)) * e;
    else
      per_token += attn_times * 2.0 * static_cast<double>(kv_local * m.head_dim()) * e;
    if (is_moe_layer(m, i)) per_token += router_times * static_cast<double>(m.n_experts) * 4.0;
  }
  return tokens * per_token;  // forward all-gathers (again when recomputed) + backward reduce-scatters
}

int64_t schedule_peak_live_closed_form(PipelineSchedule schedule, int64_t stage, int64_t pp, int64_t n_mb,
                                       int64_t v) {
  if (schedule == PipelineSchedule::Gpipe) return n_mb;
  if (v <= 1) return std::min(pp - stage, n_mb);
  return std::min(2 * (pp - stage - 1) + (v - 1) * pp + 1, v * n_mb);
}

int64_t schedule_peak_live(PipelineSchedule schedule, int64_t stage, int64_t pp, int64_t n_mb, int64_t v,
                           const PassCosts& costs) {
  const bool exact = schedule == PipelineSchedule::Gpipe || schedule == PipelineSchedule::OneFOneB ||
                     schedule == PipelineSchedule::Interleaved;
  if (exact && pp * pp * n_mb * std::max<int64_t>(v, 1) > (int64_t{1} << 14))
    return schedule_peak_live_closed_form(schedule, stage, pp, n_mb, v);
  return plan_peak_live(pipeline_plan(schedule, static_cast<int>(stage), static_cast<int>(pp), n_mb, true, v, costs));
}

MemoryPlan plan_memory(const Config& cfg, PlanDevice device) {
  MemoryPlan plan;
  const PlanInputs in = plan_mesh(cfg, device, plan);
  for (int64_t st = 0; st < plan.pp; ++st) {
    StageMemory sm;
    sm.stage = st;
    sm.params = stage_params(cfg.model, plan.pp, plan.tp, st, plan.ep, in.v, in.v_shape);
    plan_stage_state(cfg.model, plan, in, sm);
    plan_stage_activations(cfg, plan, in, sm);
    std::vector<int64_t> layers;
    for (const LayerSpan& c : sm.params.chunks)
      for (int64_t i = c.first; i < c.end; ++i) layers.push_back(i);
    if (in.v_shape ? st == 0 : st == plan.pp - 1)  // the multi-token prediction modules' layers gather too
      for (int64_t j = 0; j < cfg.model.mtp_depth; ++j) layers.push_back(cfg.model.n_layers() + j);
    plan.cp_exchange_bytes = std::max(plan.cp_exchange_bytes, cp_exchange_bytes(cfg, layers));
    plan.stages.push_back(sm);
  }
  for (size_t s = 1; s < plan.stages.size(); ++s)
    if (plan.stages[s].total() > plan.worst().total()) plan.worst_stage = static_cast<int64_t>(s);
  return plan;
}

namespace {

std::string fixed2(double x) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(2);
  s << x;
  return s.str();
}

std::string to_string(const MemoryPlan& p) {
  std::ostringstream o;
  auto gib = [](double b) {
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(3);
    s << b / kGiB << " GiB";
    return s.str();
  };
  const StageMemory& w = p.worst();
  o << "parameters: " << p.total_params << " total (" << p.total_params / 1e6 << "M), " << p.active_params
    << " active per token (" << p.active_params / 1e6 << "M), " << p.embedding_params << " in embeddings\n";
  o << "mesh: dp " << p.dp << " x pp " << p.pp << " x tp " << p.tp;
  if (p.cp > 1) o << " x cp " << p.cp;
  if (p.ep > 1) o << " (expert_parallel " << p.ep << ": routed experts split over " << p.ep << " dp ranks)";
  o << "; microbatch " << p.micro_batch_size
    << " sequences x " << p.n_microbatches << " per round\n";
  if (p.cp > 1)
    o << "context parallel: each sequence in " << 2 * p.cp << " chunks, 2 per rank (" << p.cp
      << " ranks); activations per rank are its chunks' plus the whole sequence's keys and values; exchange "
      << gib(p.cp_exchange_bytes) << " per rank and step\n";
  o << "precision: " << p.precision << "\n";
  if (p.pp > 1)
    o << "pipeline: " << p.pipeline_schedule << (p.virtual_stages > 1 ? ", " + std::to_string(p.virtual_stages) +
                                                 " virtual stages per rank" : std::string())
      << "; bubble "
      << (p.pipeline_schedule == PipelineSchedule::ZbH1 || p.pipeline_schedule == PipelineSchedule::Zbv
              ? "(the plans' timeline; forward : input-gradient : weight-gradient pass = 1 : " +
                    fixed2(p.backward_input_cost) + " : " + fixed2(p.backward_weight_cost) +
                    (p.pass_costs_given ? " from pipeline_pass_costs)" : " by FLOPs)")
              : "(pp - 1) / (v * n_mb + pp - 1)")
      << " = " << p.pipeline_bubble << " of a round\n";
  for (const auto& s : p.stages) {
    std::string layers;
    for (const LayerSpan& c : s.params.chunks)
      layers += (layers.empty() ? "[" : " [") + std::to_string(c.first) + ", " + std::to_string(c.end) + ")";
    o << "  stage " << s.stage << ": layers " << layers << ", "
      << s.params.total() << " params per rank (" << s.params.split << " tp-split, " << s.params.replicated
      << " replicated), " << s.microbatches_in_flight
      << (p.virtual_stages > 1 ? " chunk-microbatch(es)" : " microbatch(es)") << " in flight, total "
      << gib(s.total()) << "\n";
  }
  o << "memory per rank (stage " << w.stage << ", the most loaded):\n";
  o << "  weights            " << gib(w.weights) << "\n";
  o << "  gradients          " << gib(w.grads) << "\n";
  o << "  optimizer (Adam)   " << gib(w.optimizer) << "\n";
  if (p.zero_stage > 0 && p.dp * p.cp == 1)
    o << "  zero_stage " << p.zero_stage << "       nothing to shard with dp 1: runs as zero_stage 0\n";
  else if (p.zero_stage > 0)
    o << "  zero_stage " << p.zero_stage << "       "
      << (p.zero_stage == 1 ? "moments" : p.zero_stage == 2 ? "moments and gradients" : "moments, gradients and weights")
      << " sharded over dp " << p.dp << (p.cp > 1 ? " x cp " + std::to_string(p.cp) : std::string()) << "\n";
  if (w.gathered > 0) o << "  gathered (FSDP)    " << gib(w.gathered) << " (root unit + the running and the prefetched layer, or with fsdp_keep_gathered every layer)\n";
  if (w.params.experts > 0)
    o << "  of which experts   " << gib(w.experts) << " (" << w.params.experts << " routed-expert params per rank, 1/"
      << p.tp * p.ep << " of the stage's experts: tp " << p.tp << " x expert_parallel " << p.ep << ")\n";
  if (w.autocast_copies > 0) o << "  autocast copies    " << gib(w.autocast_copies) << "\n";
  o << "  activations        " << gib(w.activations) << " (no checkpointing " << gib(w.activations_none)
    << ", full checkpointing " << gib(w.activations_full) << "; cross-entropy buffer " << gib(w.logits) << ")\n";
  o << "  total              " << gib(w.total()) << "\n";
  o << "  reference layout (BigScience 18 B/param: bf16 2 + fp32 master 4 + moments 8 + grads 4): static "
    << gib(w.reference_static) << " vs ours " << gib(w.static_bytes() + w.autocast_copies) << "\n";
  return o.str();
}

nlohmann::json to_json(const MemoryPlan& p, double fpt, double device_bytes) {
  const StageMemory& w = p.worst();
  nlohmann::json j;
  j["total_params"] = p.total_params;
  j["active_params"] = p.active_params;
  j["embedding_params"] = p.embedding_params;
  j["flops_per_token"] = fpt;
  j["mesh"] = {p.dp, p.pp, p.tp};
  j["context_parallel"] = p.cp;
  j["cp_exchange_bytes"] = p.cp_exchange_bytes;
  j["device"] = p.device == PlanDevice::Cuda ? "cuda" : "cpu";
  j["micro_batch_size"] = p.micro_batch_size;
  j["n_microbatches"] = p.n_microbatches;
  if (p.pp > 1) {
    j["pipeline_schedule"] = p.pipeline_schedule;
    j["virtual_stages"] = p.virtual_stages;
    j["pipeline_bubble"] = p.pipeline_bubble;
  }
  j["worst_stage"] = w.stage;
  j["params_per_rank"] = w.params.total();
  j["expert_parallel"] = p.ep;
  j["expert_params_per_rank"] = w.params.experts;
  j["expert_bytes"] = w.experts;
  j["weights_bytes"] = w.weights;
  j["grads_bytes"] = w.grads;
  j["optimizer_bytes"] = w.optimizer;
  j["zero_stage"] = p.zero_stage;
  j["gathered_bytes"] = w.gathered;
  j["autocast_bytes"] = w.autocast_copies;
  j["activation_bytes"] = w.activations;
  j["activation_bytes_no_ckpt"] = w.activations_none;
  j["activation_bytes_full_ckpt"] = w.activations_full;
  j["logits_bytes"] = w.logits;
  j["reference_static_bytes"] = w.reference_static;
  j["total_bytes"] = w.total();
  if (device_bytes > 0) {
    j["device_bytes"] = device_bytes;
    j["fits"] = p.fits(device_bytes);
  }
  return j;
}

}  // namespace

PlanDevice plan_device(const Config& cfg, const std::string& choice) {
  // --device names one of device_config.device's values.
  const std::optional<DeviceChoice> flag = parse_choice<DeviceChoice>(choice);
  MT_CHECK(choice.empty() || flag, "plan: device must be cpu, cuda or auto, got '", choice, "'");
  const DeviceChoice d = choice.empty() ? cfg.device.device : *flag;
  if (d == DeviceChoice::Auto) return torch::cuda::is_available() ? PlanDevice::Cuda : PlanDevice::Cpu;
  return d == DeviceChoice::Cuda ? PlanDevice::Cuda : PlanDevice::Cpu;
}

ParamCount built_param_counts(const ModelConfig& m) {
  MetaLayerFactory meta;
  const Transformer model(m, meta);
  return count_built_params(model);
}

int64_t built_param_count(const ModelConfig& m) { return built_param_counts(m).total; }

std::string plan_report(const Config& cfg, PlanDevice device, double device_gib, bool json) {
  const MemoryPlan p = plan_memory(cfg, device);
  const double fpt = flops_per_token(cfg.model);
  const ParamCount built = built_param_counts(cfg.model);
  const bool same = built.total == p.total_params && built.active == p.active_params;
  const double device_bytes = device_gib * kGiB;
  if (json) {
    nlohmann::json j = to_json(p, fpt, device_bytes);
    j["built_params"] = built.total;
    j["built_active_params"] = built.active;
    j["formula_checked"] = same;
    return j.dump();
  }
  std::ostringstream o;
  o << to_string(p);
  o << "FLOPs per token (6N + attention): " << fpt << "\n";
  if (same) {
    o << "formula checked against the built model: OK\n";
  } else {
    o << "formula checked against the built model: MISMATCH, built " << built.total << " total / "
      << built.active << " active vs formula " << p.total_params << " / " << p.active_params << "\n";
  }
  if (device_gib > 0) o << "fits in " << device_gib << " GiB: " << (p.fits(device_bytes) ? "yes" : "no") << "\n";
  return o.str();
}

}  // namespace meshtrain
