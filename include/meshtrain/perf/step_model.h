#pragma once
// How long one training step of a config takes on a cluster, on paper: the
// config's mesh (n_device_axis, context_parallel, expert_parallel,
// zero_stage, virtual_stages, micro_batch_size, activation_checkpointing,
// sequence_parallel) on a described GPU and network. `meshtrain plan` with
// hardware flags prints it for one mesh; `plan --search` ranks every mesh
// by it (perf/plan_search.h). Every assumption is a field below and is
// printed with the estimate (step_assumptions_text).
//
// Compute, per rank of the slowest pipeline stage and per microbatch: GEMM
// and attention FLOPs counted from the layer shapes as the meta device's
// observer counts them (perf/op_observer.h: 2 FLOPs a multiply-add, causal
// attention half the tiles, flash's padded value head under MLA), the bytes
// of the other kernels and the kernels themselves from per-layer formulas
// fitted to that observer's counts (step_work.cpp; plan_search_test checks
// them against `bench --device meta` steps), priced as the meta model prices
// them (bench/meta_bench.h: GEMMs at 0.75 of the peak, attention at 0.25,
// other kernels at 0.40 of the memory bandwidth, 7.7 us per kernel; fitted
// to an H100's profile of GPT-2 124M). tp divides the tp-split shapes;
// sequence parallelism also the rest; cp divides the tokens.
//
// Collectives: time = latency + bus bytes / (link GB/s x efficiency), the
// bus bytes of a ring (all-reduce 2 (n-1)/n of the payload, all-gather and
// reduce-scatter (n-1)/n, all-to-all (n-1)/n, a send 1). An axis runs on
// NVLink when its group's ranks sit in one node (rank order: tp fastest,
// then cp, dp, pp: a group spans stride x size ranks), else on the network.
// Overlap, as meshtrain runs them: tp, cp and ep collectives are not
// overlapped; zero_stage 0's dp buckets are (the last microbatch's
// backward hides all but the last bucket; not under expert parallelism,
// whose gradients are summed after backward); ZeRO-1's reduce-scatter and
// all-gather are not; FSDP's gathers and reduce-scatters are prefetched
// (all but one layer's hidden under the compute); pipeline sends are hidden
// except on the bubble's path (2 (pp - 1) transfers a round).
//
// Pipeline: a round is n_mb microbatches of the slowest stage plus the
// bubble, the idle fraction of the schedule's own plans on their idealised
// timeline (time_plans, parallel/pipeline_plan.h; a backward 2 forwards,
// 3 with full recomputation).
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

// One GPU model and its links. Bandwidths one direction, per GPU.
struct Hardware {
  std::string name = "h100-sxm";
  double peak_tflops = 989;      // dense bf16 (v100: fp16) tensor FLOP/s per GPU
  double hbm_tbps = 3.35;        // device memory bandwidth, TB/s
  double memory_gib = 79.6;      // device memory as the driver reports it
  int64_t gpus_per_node = 8;
  double intra_node_gbps = 450;  // GB/s a GPU inside a node (NVLink / NVSwitch)
  double inter_node_gbps = 50;   // GB/s a GPU between nodes (a 400 Gb/s NIC per GPU)
};

// The presets `plan --gpu` names: h100-sxm, h200, a100-80, a100-40, v100-32.
// An unknown name is refused, naming the known ones.
Hardware hardware_preset(const std::string& name);
std::vector<std::string> hardware_preset_names();

struct StepAssumptions {
  // The meta model's fit (bench/meta_bench.h, MetaBenchOptions' defaults;
  // plan_search_test checks they agree).
  double gemm_efficiency = 0.75;
  double attention_efficiency = 0.25;
  double memory_efficiency = 0.40;
  double kernel_gap_us = 7.7;
  // Bus bandwidth reached, as a fraction of the link's (NCCL's ring
  // collectives at large messages reach ~80% of NVLink's and of a NIC's;
  // all-to-all, many small peer messages, less).
  double ring_efficiency = 0.80;       // all-reduce, all-gather, reduce-scatter
  double all_to_all_efficiency = 0.60;
  double p2p_efficiency = 0.80;
  double intra_node_latency_us = 10;   // per collective call
  double inter_node_latency_us = 25;
  // Of the device memory, what a run may plan to use: the CUDA context, NCCL's
  // buffers, kernels' workspaces and the allocator's fragmentation take the rest.
  double usable_memory = 0.90;
};

// Seconds of one step, by part; the parts add up to step_s.
struct StepParts {
  double compute = 0;      // every microbatch's forward + backward on the slowest stage
  double tp = 0, cp = 0, ep = 0;  // their collectives (not overlapped)
  double fsdp = 0;         // FSDP's gathers / reduce-scatters left uncovered by compute
  double bubble = 0;       // pipeline idle time
  double pp = 0;           // pipeline sends on the bubble's path, tied-embedding sums
  double dp = 0;           // gradient reduction (and ZeRO's gather) left exposed
  double optimizer = 0;    // gradient norm, clipping and AdamW on this rank's share
  double sum() const { return compute + tp + cp + ep + fsdp + bubble + pp + dp + optimizer; }
};

// Which link each axis runs on (true: inside a node).
struct AxisLinks {
  bool tp = true, cp = true, ep = true, dp = true, pp = true;
};

struct StepEstimate {
  StepParts parts;
  double step_s = 0;
  double tokens_per_step = 0;   // whole cluster
  double tokens_per_sec = 0;    // whole cluster
  double mfu = 0;               // flops_per_token (plan.h) x tokens/s over world x peak
  double bubble_fraction = 0;   // of a round
  int64_t world = 1, n_microbatches = 1, slowest_stage = 0;
  AxisLinks links;
  // What the compute part is made of, per microbatch on the slowest stage.
  double gemm_tflop = 0, attention_tflop = 0, other_gb = 0, kernels = 0;
  double dp_bytes = 0;          // gradient payload a rank reduces per step
};

// Idle fractions of pipeline plans, by (schedule, pp, microbatches, v,
// full recomputation): a search asks for the same ones many times.
using BubbleCache = std::map<std::tuple<int, int64_t, int64_t, int64_t, bool>, double>;

// The estimate for cfg's mesh; the config must be valid (config/load.h
// validate) and its world a multiple of, or within, one node.
StepEstimate estimate_step(const Config& cfg, const Hardware& hw, const StepAssumptions& a,
                           BubbleCache* bubbles = nullptr);

// The assumptions as lines of text (`plan` prints them under an estimate).
std::string step_assumptions_text(const Hardware& hw, const StepAssumptions& a);

// One mesh's estimate as text (plan with hardware flags, no --search); its
// JSON is plan_search.h's estimate_json.
std::string step_estimate_text(const StepEstimate& e, const Hardware& hw);

}  // namespace meshtrain
