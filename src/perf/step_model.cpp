// The step-time model (perf/step_model.h): compute per stage, collectives per
// axis, what overlaps, the pipeline bubble.
#include "meshtrain/perf/step_model.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/parallel/pipeline_plan.h"
#include "meshtrain/perf/plan.h"
#include "step_work.h"

namespace meshtrain {

namespace {

// Vendor figures (NVIDIA's H100 / H200 / A100 / V100 data sheets): dense
// bf16 tensor FLOP/s (the V100 has no bf16: its fp16), memory bandwidth, the
// memory the driver reports, NVLink one way (900 / 600 / 300 GB/s both ways),
// and one NIC per GPU as in a DGX (400 Gb/s NDR; 200 Gb/s HDR; 100 Gb/s).
const std::vector<Hardware>& presets() {
  static const std::vector<Hardware> list = {
      {"h100-sxm", 989, 3.35, 79.6, 8, 450, 50},
      {"h200", 989, 4.8, 140.4, 8, 450, 50},
      {"a100-80", 312, 2.04, 80.0, 8, 300, 25},
      {"a100-40", 312, 1.555, 40.0, 8, 300, 25},
      {"v100-32", 125, 0.9, 31.7, 8, 150, 12.5},
  };
  return list;
}

// A collective over `n` ranks that moves `payload` bytes of a rank's buffer
// (an all-reduce's input, an all-gather's output, a reduce-scatter's input,
// an all-to-all's send buffer): ring bus bytes factor * (n - 1) / n of it.
struct Link {
  double gbps = 0, latency_s = 0;
};

double collective_s(double payload, int64_t n, double factor, const Link& link, double efficiency) {
  if (n <= 1 || payload <= 0) return 0;
  const double bus = factor * static_cast<double>(n - 1) / static_cast<double>(n) * payload;
  return link.latency_s + bus / (link.gbps * 1e9 * efficiency);
}

// A group of `size` ranks `stride` apart (rank order tp, cp, dp, pp) sits in
// one node when the ranks it spans do.
bool inside_node(int64_t stride, int64_t size, int64_t gpus_per_node) {
  return size <= 1 || gpus_per_node % (stride * size) == 0;
}

Link link_of(bool intra, const Hardware& hw, const StepAssumptions& a) {
  return intra ? Link{hw.intra_node_gbps, a.intra_node_latency_us * 1e-6}
               : Link{hw.inter_node_gbps, a.inter_node_latency_us * 1e-6};
}

// Everything one stage spends on a microbatch.
struct StageTime {
  MicrobatchWork work;
  double compute = 0, backward = 0;  // seconds; backward: what dp buckets can hide under
  double tp = 0, cp = 0, ep = 0, fsdp_comm = 0, fsdp_layer = 0;
  double params = 0, experts = 0;    // on one rank of the stage
  double root = 0;                   // of params: outside the layers (embedding, final norm, head)
  double total() const { return compute + tp + cp + ep + std::max(0.0, fsdp_comm - compute) + fsdp_layer; }
};

double work_s(const Work& w, const Hardware& hw, const StepAssumptions& a) {
  const double peak = hw.peak_tflops * 1e12;
  return w.gemm_flop / (a.gemm_efficiency * peak) + w.attention_flop / (a.attention_efficiency * peak) +
         w.bytes / (a.memory_efficiency * hw.hbm_tbps * 1e12) + w.kernels * a.kernel_gap_us * 1e-6;
}

struct MeshFacts {
  int64_t dp, pp, tp, cp, ep, replicas, zero, v, n_mb, mbs;
  double tokens, e;  // this rank's tokens a microbatch; bytes per activation element
  AxisLinks links;
};

MeshFacts mesh_facts(const Config& cfg, const Hardware& hw) {
  MeshFacts f;
  f.dp = cfg.device.dp();
  f.pp = cfg.device.pp();
  f.tp = cfg.device.tp();
  f.cp = cfg.device.cp();
  f.ep = cfg.device.expert_parallel;
  f.replicas = f.dp * f.cp;
  f.zero = cfg.zero_stage_on(f.replicas);
  f.v = virtual_stages(cfg, f.pp);
  const int64_t share = cfg.data.train_batch_size / f.dp;
  f.mbs = cfg.data.micro_batch_size > 0 ? std::min(cfg.data.micro_batch_size, share) : share;
  f.n_mb = std::max<int64_t>(1, share / f.mbs);
  f.tokens = static_cast<double>(f.mbs * cfg.model.T / f.cp);
  f.e = cfg.model.model_dtype == ModelDtype::Bfloat16 ? 2.0 : 4.0;
  const int64_t g = hw.gpus_per_node;
  f.links.tp = inside_node(1, f.tp, g);
  f.links.cp = inside_node(f.tp, f.cp, g);
  f.links.ep = inside_node(f.tp, f.ep, g);
  f.links.dp = inside_node(f.tp, f.replicas, g);
  f.links.pp = inside_node(f.tp * f.replicas, f.pp, g);
  return f;
}

// tp: two regions a layer (attention, feed-forward), each an all-reduce (or
// sequence parallelism's all-gather + reduce-scatter: the same bus bytes)
// forward and one backward; full recomputation repeats the forward's; the
// vocab-parallel embedding sums its lookup once.
double tp_seconds(const Config& cfg, const MeshFacts& f, const std::vector<int64_t>& layers, bool first,
                  const Link& link, const StepAssumptions& a) {
  if (f.tp == 1) return 0;
  const double payload = f.tokens * static_cast<double>(cfg.model.model_dimension) * f.e;
  const double per = collective_s(payload, f.tp, 2, link, a.ring_efficiency);
  const double calls = (cfg.activation_checkpointing == ActivationCheckpointing::Full ? 6 : 4) *
                           static_cast<double>(layers.size()) + (first ? 1 : 0);
  // Sequence parallelism makes each call two (an all-gather and a reduce-scatter): twice the latency.
  return calls * per + (cfg.sequence_parallel ? calls * link.latency_s : 0);
}

// ep: each MoE layer's dispatch and combine all-to-alls, and their backward
// (recomputation of the layer or of the feed-forward repeats the forward's).
double ep_seconds(const Config& cfg, const MeshFacts& f, const std::vector<int64_t>& layers, const Link& link,
                  const StepAssumptions& a) {
  if (f.ep == 1) return 0;
  int64_t moe = 0;
  for (int64_t i : layers) moe += is_moe_layer(cfg.model, i) ? 1 : 0;
  const double payload =
      f.tokens * expert_slots(cfg.model) * static_cast<double>(cfg.model.model_dimension) * f.e;
  const double calls = cfg.activation_checkpointing == ActivationCheckpointing::None ? 4 : 6;
  return static_cast<double>(moe) * calls * collective_s(payload, f.ep, 1, link, a.all_to_all_efficiency);
}

// cp: the stage's share of cp_exchange_bytes (plan.h: the keys and values
// gathered forward, their gradients reduce-scattered backward, MoE router
// logits both ways, per step), in calls of one layer each.
double cp_seconds(const Config& cfg, const MeshFacts& f, const std::vector<int64_t>& layers, const Link& link,
                  const StepAssumptions& a) {
  if (f.cp == 1) return 0;
  const double per_step = cp_exchange_bytes(cfg, layers);
  const double microbatches = static_cast<double>(f.n_mb * cfg.grad_step);
  const double bus = static_cast<double>(f.cp - 1) / static_cast<double>(f.cp) * per_step / microbatches;
  double calls = 0;
  for (int64_t i : layers) calls += (cfg.activation_checkpointing == ActivationCheckpointing::Full ? 3 : 2) +
                                    (is_moe_layer(cfg.model, i) ? 2 : 0);
  return bus / (link.gbps * 1e9 * a.ring_efficiency) + calls * link.latency_s;
}

// FSDP (zero_stage 2/3) a microbatch: stage 3 gathers each layer forward and
// again backward (bf16 under mixed precision), both stages reduce-scatter its
// fp32 gradients; fsdp_keep_gathered does both once a step (spread here over
// the step's microbatches). Experts under ep reduce over dp / ep ranks.
void fsdp_seconds(const Config& cfg, const MeshFacts& f, const Hardware& hw, const StepAssumptions& a,
                  double layer_params, double layer_experts, int64_t n_layers, StageTime& t) {
  if (f.zero < 2 || n_layers == 0) return;
  const double w = f.e;  // gathered width: bf16 under mixed precision
  const double per_step = cfg.fsdp_keep_gathered ? 1.0 / static_cast<double>(f.n_mb * cfg.grad_step) : 1.0;
  const double gathers = f.zero == 3 ? 2 : 0;
  const Link dense = link_of(f.links.dp, hw, a);
  const Link experts = link_of(inside_node(f.tp * f.ep, f.replicas / f.ep, hw.gpus_per_node), hw, a);
  const double dense_params = layer_params - layer_experts;
  auto pass = [&](double params, int64_t n, const Link& l) {
    return gathers * collective_s(w * params, n, 1, l, a.ring_efficiency) +
           collective_s(4 * params, n, 1, l, a.ring_efficiency);
  };
  const double comm = per_step * (pass(dense_params, f.replicas, dense) +
                                  (f.ep > 1 ? pass(layer_experts, f.replicas / f.ep, experts) : 0));
  t.fsdp_comm = comm;
  t.fsdp_layer = comm / static_cast<double>(n_layers);  // the first gather and the last reduce-scatter
}

StageTime stage_time(const Config& cfg, const MeshFacts& f, const Hardware& hw, const StepAssumptions& a,
                     int64_t stage) {
  const auto ranges = partition_stages(cfg.model.n_layers(), static_cast<int>(f.pp), f.v);
  const std::vector<int64_t> layers = ranges.at(static_cast<size_t>(stage)).layers();
  StageTime t;
  t.work = stage_microbatch_work(cfg, layers, stage == 0, stage == f.pp - 1);
  t.compute = work_s(t.work.forward, hw, a) + work_s(t.work.backward, hw, a);
  t.backward = work_s(t.work.backward, hw, a);
  t.tp = tp_seconds(cfg, f, layers, stage == 0, link_of(f.links.tp, hw, a), a);
  t.cp = cp_seconds(cfg, f, layers, link_of(f.links.cp, hw, a), a);
  t.ep = ep_seconds(cfg, f, layers, link_of(f.links.ep, hw, a), a);
  const StageParams sp = stage_params(cfg.model, f.pp, f.tp, stage, f.ep, f.v);
  t.params = static_cast<double>(sp.total());
  t.experts = static_cast<double>(sp.experts);
  double in_layers = 0;
  for (int64_t i : layers) {
    // As plan.cpp's layer_params_per_rank: routed experts split over tp x ep.
    const LayerParamCount l = layer_param_count(cfg.model, i);
    const double b = cfg.model.linear_bias ? 1 : 0, E = static_cast<double>(cfg.model.n_experts);
    const double routed = l.routed > 0 ? static_cast<double>(l.routed) - E * b * static_cast<double>(cfg.model.model_dimension) : 0;
    in_layers += (static_cast<double>(l.split) - routed) / static_cast<double>(f.tp) +
                 routed / static_cast<double>(f.tp * f.ep) + static_cast<double>(l.replicated);
  }
  t.root = std::max(0.0, t.params - in_layers);
  fsdp_seconds(cfg, f, hw, a, in_layers, t.experts, static_cast<int64_t>(layers.size()), t);
  return t;
}

// The schedule's own idle fraction: its plans for every stage replayed on
// the idealised timeline (a backward 2 forwards, 3 recomputing the layer).
double bubble_fraction(const Config& cfg, const MeshFacts& f, BubbleCache* cache) {
  if (f.pp == 1) return 0;
  const bool full = cfg.activation_checkpointing == ActivationCheckpointing::Full;
  const PipelineSchedule s = f.v > 1 ? PipelineSchedule::Interleaved : cfg.pipeline_schedule;
  const auto key = std::make_tuple(static_cast<int>(s), f.pp, f.n_mb, f.v, full);
  if (cache != nullptr) {
    const auto hit = cache->find(key);
    if (hit != cache->end()) return hit->second;
  }
  double idle = pipeline_bubble_fraction(static_cast<int>(f.pp), f.n_mb, f.v);
  // Plans grow with pp x microbatches x v, and an interleaved stage's plan
  // is made by replaying every stage (pp times that for all of them); beyond
  // this size replaying them costs more than the closed form they follow
  // (1F1B exactly).
  const bool plannable = s == PipelineSchedule::Gpipe || s == PipelineSchedule::OneFOneB ||
                         s == PipelineSchedule::Interleaved;
  const int64_t replays = s == PipelineSchedule::Interleaved ? f.pp : 1;
  if (plannable && replays * f.pp * f.n_mb * f.v <= 65536) {
    std::vector<std::vector<PipeOp>> plans;
    for (int st = 0; st < f.pp; ++st)
      plans.push_back(pipeline_plan(s, st, static_cast<int>(f.pp), f.n_mb, true, s == PipelineSchedule::Interleaved ? f.v : 1));
    PassCosts costs;
    costs.forward = 1;
    costs.backward_input = full ? 3 : 2;
    costs.backward_weight = 0;
    idle = time_plans(plans, f.v, false, costs).idle_fraction;
  }
  if (cache != nullptr) (*cache)[key] = idle;
  return idle;
}

// Gradient reduction once a step, and what of it stays exposed. zero_stage 0:
// an fp32 all-reduce in buckets during the last microbatch's backward (not
// under ep, or with overlap_grad_reduce false: after it), the last bucket
// always after; ZeRO-1: a reduce-scatter of the gradients and an all-gather
// of the updated fp32 parameters, after backward; FSDP: the root unit's
// reduce-scatter (and stage 2's all-gather of every fp32 parameter).
double dp_seconds(const Config& cfg, const MeshFacts& f, const Hardware& hw, const StepAssumptions& a,
                  const StageTime& t, double* bytes) {
  if (f.replicas == 1) return 0;
  const double dense = t.params - t.experts, experts = t.experts;
  const Link ld = link_of(f.links.dp, hw, a);
  const Link le = link_of(inside_node(f.tp * f.ep, f.replicas / f.ep, hw.gpus_per_node), hw, a);
  const int64_t ne = f.replicas / f.ep;
  const double eff = a.ring_efficiency;
  *bytes = 4 * t.params;
  if (f.zero == 0) {
    const double all = collective_s(4 * dense, f.replicas, 2, ld, eff) + collective_s(4 * experts, ne, 2, le, eff);
    if (!cfg.overlap_grad_reduce || f.ep > 1) return all;
    const double bucket = std::min(4 * t.params, cfg.grad_bucket_mb * 1024 * 1024);
    return std::max(collective_s(bucket, f.replicas, 2, ld, eff), all - t.backward);
  }
  if (f.zero == 1)
    return 2 * (collective_s(4 * dense, f.replicas, 1, ld, eff) + collective_s(4 * experts, ne, 1, le, eff));
  // FSDP: the layers were reduced per microbatch (fsdp_seconds); the root
  // unit (embedding, final norm, head) here, and stage 2's whole parameters.
  const double gather = f.zero == 2 ? collective_s(4 * dense, f.replicas, 1, ld, eff) +
                                          collective_s(4 * experts, ne, 1, le, eff)
                                    : 0;
  return gather + collective_s(4 * t.root, f.replicas, 1, ld, eff);
}

}  // namespace

Hardware hardware_preset(const std::string& name) {
  for (const Hardware& h : presets())
    if (h.name == name) return h;
  std::string known;
  for (const auto& n : hardware_preset_names()) known += (known.empty() ? "" : ", ") + n;
  MT_FAIL("plan --gpu: unknown GPU preset '", name, "'; known: ", known,
          " (or describe one with --peak-tflops, --hbm-tbps, --device-memory-gb and the link flags)");
}

std::vector<std::string> hardware_preset_names() {
  std::vector<std::string> names;
  for (const Hardware& h : presets()) names.push_back(h.name);
  return names;
}

namespace {

// Pipeline sends on the bubble's path: a round's first microbatch crosses
// every stage boundary forward and its last one backward (an activation of
// this rank's tokens, split over tp under sequence parallelism); tied
// embeddings (and multi-token prediction's copy) sum their fp32 gradients
// between the first and last stage.
double pp_seconds(const Config& cfg, const MeshFacts& f, const Hardware& hw, const StepAssumptions& a) {
  if (f.pp == 1) return 0;
  const ModelConfig& m = cfg.model;
  const Link l = link_of(f.links.pp, hw, a);
  const double payload = f.tokens * static_cast<double>(m.model_dimension) * f.e /
                         (cfg.sequence_parallel ? static_cast<double>(f.tp) : 1.0);
  const double send = l.latency_s + payload / (l.gbps * 1e9 * a.p2p_efficiency);
  const double vocab_local = std::ceil(static_cast<double>(m.vocab_size) / static_cast<double>(f.tp));
  const double tied = m.tie_embeddings || m.mtp_depth > 0
                          ? collective_s(4 * vocab_local * static_cast<double>(m.model_dimension), 2, 2, l,
                                         a.ring_efficiency)
                          : 0;
  return static_cast<double>(cfg.grad_step) * 2 * static_cast<double>(f.pp - 1) * send + tied;
}

}  // namespace

StepEstimate estimate_step(const Config& cfg, const Hardware& hw, const StepAssumptions& a, BubbleCache* cache) {
  const MeshFacts f = mesh_facts(cfg, hw);
  StepEstimate e;
  e.world = cfg.device.world();
  e.n_microbatches = f.n_mb;
  e.links = f.links;
  std::vector<StageTime> stages;
  for (int64_t st = 0; st < f.pp; ++st) {
    stages.push_back(stage_time(cfg, f, hw, a, st));
    if (stages.back().total() > stages.at(static_cast<size_t>(e.slowest_stage)).total()) e.slowest_stage = st;
  }
  const StageTime& s = stages.at(static_cast<size_t>(e.slowest_stage));
  const double rounds = static_cast<double>(cfg.grad_step), n = static_cast<double>(f.n_mb);
  e.bubble_fraction = bubble_fraction(cfg, f, cache);
  StepParts& p = e.parts;
  p.compute = rounds * n * s.compute;
  p.tp = rounds * n * s.tp;
  p.cp = rounds * n * s.cp;
  p.ep = rounds * n * s.ep;
  p.fsdp = rounds * n * (std::max(0.0, s.fsdp_comm - s.compute) + s.fsdp_layer);
  p.bubble = rounds * n * s.total() * e.bubble_fraction / (1 - e.bubble_fraction);
  p.pp = pp_seconds(cfg, f, hw, a);
  // Every stage reduces and updates its own parameters at the step's end:
  // the slowest of them ends the step.
  for (const StageTime& st : stages) {
    double bytes = 0;
    p.dp = std::max(p.dp, dp_seconds(cfg, f, hw, a, st, &bytes));
    e.dp_bytes = std::max(e.dp_bytes, bytes);
    const double owned = f.zero >= 1 ? (st.params - st.experts) / static_cast<double>(f.replicas) +
                                           st.experts / static_cast<double>(f.replicas / f.ep)
                                     : st.params;
    p.optimizer = std::max(p.optimizer, work_s(optimizer_work(cfg, owned, st.params, f.n_mb * cfg.grad_step), hw, a));
  }
  e.step_s = p.sum();
  e.tokens_per_step = static_cast<double>(cfg.data.train_batch_size * cfg.grad_step * cfg.model.T);
  e.tokens_per_sec = e.tokens_per_step / e.step_s;
  e.mfu = flops_per_token(cfg.model) * e.tokens_per_sec / (static_cast<double>(e.world) * hw.peak_tflops * 1e12);
  Work w = s.work.forward;
  w += s.work.backward;
  e.gemm_tflop = w.gemm_flop / 1e12;
  e.attention_tflop = w.attention_flop / 1e12;
  e.other_gb = w.bytes / 1e9;
  e.kernels = w.kernels;
  return e;
}

std::string step_assumptions_text(const Hardware& hw, const StepAssumptions& a) {
  std::ostringstream o;
  o << "hardware: " << hw.name << ": " << hw.peak_tflops << " TFLOP/s dense bf16, " << hw.hbm_tbps << " TB/s, "
    << hw.memory_gib << " GiB (" << a.usable_memory * 100 << "% usable), " << hw.gpus_per_node
    << " GPUs a node, " << hw.intra_node_gbps << " GB/s a GPU inside a node, " << hw.inter_node_gbps
    << " GB/s a GPU between nodes (one direction)\n";
  o << "assumed compute (the meta model's fit, bench --device meta): GEMMs at " << a.gemm_efficiency
    << " of the peak, attention at " << a.attention_efficiency << ", other kernels at " << a.memory_efficiency
    << " of the memory bandwidth, " << a.kernel_gap_us << " us a kernel\n";
  o << "assumed collectives: ring bus bytes (all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n)"
    << " at " << a.ring_efficiency << " of the link (all-to-all " << a.all_to_all_efficiency << ", sends "
    << a.p2p_efficiency << "), " << a.intra_node_latency_us << " us a call inside a node, "
    << a.inter_node_latency_us << " us across; an axis is inside a node when its ranks are (order tp, cp, dp, pp)\n";
  o << "assumed overlap: tp, cp, ep not overlapped; dp buckets (zero_stage 0, no ep) under the last microbatch's "
       "backward but the last bucket; ZeRO-1's reduce-scatter and gather not; FSDP's prefetch all but one layer; "
       "pipeline sends all but 2 (pp - 1) a round; the bubble from the schedule's plans\n";
  return o.str();
}

std::string step_estimate_text(const StepEstimate& e, const Hardware& hw) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  auto ms = [](double s) { return s * 1e3; };
  const int64_t nodes = (e.world + hw.gpus_per_node - 1) / hw.gpus_per_node;
  o << "estimate on " << e.world << " x " << hw.name << " (" << nodes << " node" << (nodes > 1 ? "s" : "")
    << "): " << ms(e.step_s) << " ms a step, " << std::setprecision(0) << e.tokens_per_sec << " tokens/s ("
    << e.tokens_per_sec / static_cast<double>(e.world) << " a GPU), MFU " << std::setprecision(1) << e.mfu * 100
    << "%\n";
  auto where = [](bool intra) { return intra ? "NVLink" : "network"; };
  o << "  links: tp " << where(e.links.tp) << ", cp " << where(e.links.cp) << ", ep " << where(e.links.ep) << ", dp "
    << where(e.links.dp) << ", pp " << where(e.links.pp) << "\n";
  o << std::setprecision(3) << "  a microbatch on stage " << e.slowest_stage << " (the slowest): GEMM " << e.gemm_tflop
    << " TFLOP, attention " << e.attention_tflop << " TFLOP, other kernels " << e.other_gb << " GB, "
    << std::setprecision(0) << e.kernels << " kernels; " << e.n_microbatches << " microbatches a round\n";
  const StepParts& p = e.parts;
  o << std::setprecision(1) << "  step parts (ms): compute " << ms(p.compute) << ", tp " << ms(p.tp) << ", cp "
    << ms(p.cp) << ", ep " << ms(p.ep) << ", fsdp " << ms(p.fsdp) << ", bubble " << ms(p.bubble) << " ("
    << e.bubble_fraction * 100 << "% of a round), pp " << ms(p.pp) << ", dp " << ms(p.dp) << ", optimizer "
    << ms(p.optimizer) << "\n";
  return o.str();
}

}  // namespace meshtrain
