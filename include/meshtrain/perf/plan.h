#pragma once
// What a config costs before it runs: parameters (total / active), memory per
// rank of the most loaded pipeline stage, and FLOPs per token for MFU.
//
// Precision model (bytes per parameter this rank holds), the same on every
// device (model/mixed_precision.h):
//   model_dtype float32:   weights 4 + grads 4 + Adam moments 8 = 16
//   model_dtype bfloat16:  fp32 master weights, grads and moments, so again
//                          4 + 4 + 8 = 16, plus the bf16 casts the layers make
//                          of the weights during forward/backward (2, transient).
//   Reference (BigScience / Megatron mixed precision): bf16 weights 2 + fp32
//                          master 4 + moments 8 + fp32 grads 4 = 18;
//                          printed beside ours for comparison only.
// zero_stage 1 shards the Adam moments (and, in the reference layout, the fp32
// master copy) over dp; under expert parallelism the routed experts' moments
// over the dp / expert_parallel ranks that hold the same experts. zero_stage 2
// shards the gradients too and 3 (FSDP) the parameters as well: at rest a rank
// holds (4 + 4 + 8) bytes per element of its owned slices
// (fsdp_slice_elements), plus, stage 2, the whole fp32 parameters; while a
// layer runs, stage 3 also holds it whole (`gathered`: the root unit in fp32,
// the running and the prefetched layer, in bf16 under mixed precision;
// fsdp_keep_gathered: every layer, through the step, and whole fp32 layer
// gradients on top of the slices, stages 2 and 3). Non-trainable parameters (frozen) hold no gradient nor
// moments and stay whole.
//
// Activations per microbatch and layer follow Korthikanti et al. 2022
// ("Reducing Activation Recomputation in Large Transformer Models"): for
// dropout > 0 and a 4d MLP, s*b*h*(34 + 5*a*s/h) bytes in 16-bit. We count the
// same stored tensors in elements, generalised to this model's widths (MLP
// hidden, MoE: k routed + shared experts, MLA projections), at 2 bytes (bf16)
// or 4 bytes (fp32) per element and 1 byte per dropout-mask element.
// Tensor parallelism divides the head/hidden-split tensors by tp; sequence
// parallelism divides everything. Attention goes through SDPA: fused kernels
// (flash / memory-efficient) keep no s*s score matrix; the math kernel (CPU
// with dropout, or when query and value head sizes differ, i.e. MLA with rope
// dims) keeps the softmax output (and dropout's output and mask). Checked
// against what a CPU forward keeps alive (plan_test: within 10%). Microbatches in flight:
// 1 for pp = 1, all of them for gpipe, min(pp - stage, n) for 1f1b.
// Checkpointing "full" keeps each layer's input plus one layer's full set;
// "selective" drops the s*s attention terms. The last stage adds the fp32
// log-softmax buffer of its cross-entropy: b*s*vocab/tp*4 bytes per microbatch.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/flops.h"
#include "meshtrain/parallel/pipeline_plan.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

enum class PlanDevice { Cpu, Cuda };

// Parameters one rank of a stage holds, split into what tp shards and what
// every tp rank replicates (both already per rank: split counts are /tp).
struct StageParams {
  int64_t first_layer = 0, end_layer = 0;  // chunk 0
  std::vector<LayerSpan> chunks;           // every chunk (interleaved: virtual_stages of them)
  int64_t split = 0;       // this rank's shard of tp-split tensors
  int64_t replicated = 0;  // norms, MLA down-projections and rope key, router
  int64_t experts = 0;     // of `split`: this rank's routed experts (split over tp and expert_parallel)
  int64_t frozen = 0;      // of `replicated`: non-trainable (the router's selection bias): no gradient, no moments
  int64_t total() const { return split + replicated; }
};

// FSDP (zero_stage 2/3, parallel/fsdp.h): elements of the slices one dp rank
// owns of a stage's trainable parameters, unit by unit as the runtime lays
// them out (the root unit and one per layer; each padded to a multiple of dp,
// the routed experts under expert parallelism apart, padded to dp / ep).
int64_t fsdp_slice_elements(const ModelConfig& m, int64_t pp, int64_t tp, int64_t stage, int64_t dp, int64_t ep = 1,
                            int64_t v = 1, bool v_shape = false);

// Parameters of pipeline stage `stage` of pp on one tp rank of tp. Tied
// embeddings: the stage with the head (the last; stage 0 under the zbv
// schedule's V, v_shape) holds its own copy of the table (pp > 1).
// The vocabulary is padded to a multiple of tp, as the vocab-parallel layers do.
// ep (device_config.expert_parallel) divides the routed experts' weights
// (w_in, w_out, b_in; b_out stays whole on every rank). v: layer chunks per
// stage (the interleaved schedule's virtual_stages, or zbv's 2 with v_shape).
StageParams stage_params(const ModelConfig& m, int64_t pp, int64_t tp, int64_t stage, int64_t ep = 1,
                         int64_t v = 1, bool v_shape = false);

struct StageMemory {
  int64_t stage = 0;
  StageParams params;
  int64_t microbatches_in_flight = 1;
  double weights = 0, grads = 0, optimizer = 0;
  double autocast_copies = 0;      // CUDA bf16: transient bf16 weight copies
  double activations = 0;          // with the config's activation_checkpointing
  double activations_none = 0;     // no checkpointing
  double activations_full = 0;     // activation_checkpointing "full"
  double logits = 0;               // last stage: cross-entropy buffer (in `activations*` too)
  double reference_static = 0;     // weights + grads + optimizer in the 18 B/param layout
  double experts = 0;              // of weights + grads + optimizer: the routed experts this rank holds
  double gathered = 0;             // zero_stage 3: whole parameters while they run (root + 2 layers, or all)
  double static_bytes() const { return weights + grads + optimizer; }
  double total() const { return static_bytes() + gathered + autocast_copies + activations; }
};

struct MemoryPlan {
  PlanDevice device = PlanDevice::Cpu;
  int64_t zero_stage = 0;
  std::string precision;           // one line describing the precision model used
  int64_t dp = 1, pp = 1, tp = 1, ep = 1;
  int64_t cp = 1;                  // device_config.context_parallel (dp counts batch shares)
  // Context parallelism's traffic per rank and training step, on the most
  // loaded stage: cp_exchange_bytes() of its layers.
  double cp_exchange_bytes = 0;
  int64_t total_params = 0, active_params = 0, embedding_params = 0;
  int64_t micro_batch_size = 0, n_microbatches = 1;
  PipelineSchedule pipeline_schedule = PipelineSchedule::OneFOneB;  // meaningful when pp > 1
  int64_t virtual_stages = 1;      // layer chunks per stage
  double pipeline_bubble = 0;      // idle fraction of a round, pipeline_bubble_fraction() (pp > 1)
  // Zero-bubble schedules: their plans' idle fraction is timed with these
  // pass costs, relative to a forward (pipeline_pass_costs: the config's
  // key when given, else the FLOP ratios, model/flops.h).
  double backward_input_cost = 1, backward_weight_cost = 1;
  bool pass_costs_given = false;
  double activation_bytes_per_element = 4;
  std::vector<StageMemory> stages;  // one per pipeline stage (per rank of it)
  int64_t worst_stage = 0;          // the stage with the largest total

  const StageMemory& worst() const { return stages.at(static_cast<size_t>(worst_stage)); }
  double total_bytes() const { return worst().total(); }
  bool fits(double device_bytes) const { return total_bytes() <= device_bytes; }
};

// device: what the run would use; the precision model above depends on it.
MemoryPlan plan_memory(const Config& cfg, PlanDevice device);

// Microbatches (counted per chunk) that a stage's schedule holds at once:
// plan_peak_live of its pipeline_plan, or, for plans of more than 2^14
// steps summed over the stages (building one interleaved plan replays every
// stage, so `plan --search` at thousands of GPUs would spend minutes here),
// the closed form those plans follow: gpipe n_mb; 1f1b min(pp - stage, n_mb);
// interleaved min(2 (pp - stage - 1) + (v - 1) pp + 1, v n_mb), Megatron's
// warm-up plus one (plan_search_test checks both against the plans).
// costs: the zero-bubble plans' (pipeline_pass_costs).
int64_t schedule_peak_live(PipelineSchedule schedule, int64_t stage, int64_t pp, int64_t n_mb, int64_t v,
                           const PassCosts& costs = {});
int64_t schedule_peak_live_closed_form(PipelineSchedule schedule, int64_t stage, int64_t pp, int64_t n_mb, int64_t v);

// Bytes the cp group's collectives move per training step on a rank running
// `layers` (as the communicators count them, comm.h: an all-gather its output,
// a reduce-scatter its input): per layer and microbatch, forward gathers the
// whole sequence's keys and values (this rank's kv heads; MLA: the latent and
// the rope key) and backward reduce-scatters their gradients, each
// B * T * width * activation bytes; an MoE layer adds its router logits
// (B * T * n_experts, fp32) both ways; recomputation gathers once more
// (full: both, selective: the router's). 0 without context parallelism.
double cp_exchange_bytes(const Config& cfg, const std::vector<int64_t>& layers);

// flops_per_token and pass_cost_ratios: model/flops.h.

// The device a plan assumes: `choice` ("cpu" | "cuda"), else the config's
// device_config.device, where "auto" means what this machine would run on.
PlanDevice plan_device(const Config& cfg, const std::string& choice = "");

// Builds the whole model with plain (unsharded) layers on the meta device (no
// memory, no init, any size) and counts its parameters (total, active), to
// check count_params().
ParamCount built_param_counts(const ModelConfig& m);
int64_t built_param_count(const ModelConfig& m);

// `meshtrain plan`'s output: the report (parameters, per-stage split, memory of
// the most loaded rank, FLOPs per token, the built-model check and, when
// device_gib > 0, whether it fits), or the same as one JSON object.
std::string plan_report(const Config& cfg, PlanDevice device, double device_gib, bool json);

}  // namespace meshtrain
