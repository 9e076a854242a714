// The plan's parameter counts against built models, its per-stage split, the
// memory knobs (ZeRO-1, checkpointing), and its static and activation bytes
// against what a tiny CPU run really holds.
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "meshtrain/config/load.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/bench/bench.h"
#include "meshtrain/train/memory_check.h"
#include "meshtrain/perf/plan.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

Config tiny(AttentionKind attention, FfnKind ffn, bool tied) {
  Config c = load_config(std::string(MT_SOURCE_DIR) + "/configs/tiny.json").config;
  c.model.attention = attention;
  c.model.ffn = ffn;
  c.model.tie_embeddings = tied;
  if (attention == AttentionKind::Mla) {
    c.model.latent_dim = 32;
    c.model.dhR = 8;
  }
  if (ffn == FfnKind::Moe) {
    c.model.n_experts = 4;
    c.model.k = 2;
    c.model.n_shared = 1;
    c.model.mlp_hidden = 64;
  }
  return c;
}

std::vector<Config> variants() {
  std::vector<Config> v;
  for (AttentionKind att : {AttentionKind::Mha, AttentionKind::Mla})
    for (FfnKind ffn : {FfnKind::Dense, FfnKind::Moe})
      for (bool tied : {true, false}) v.push_back(tiny(att, ffn, tied));
  // Llama's and DeepSeek-V3's options (hf/): gated MLPs, fewer kv heads,
  // latent norms, the score bias and a dense first layer.
  Config llama = tiny(AttentionKind::Mha, FfnKind::Dense, false);
  llama.model.mlp_activation = MlpActivation::Swiglu;
  llama.model.n_kv_head = 2;
  v.push_back(llama);
  Config v3 = tiny(AttentionKind::Mla, FfnKind::Moe, false);
  v3.model.mlp_activation = MlpActivation::Swiglu;
  v3.model.mla_latent_norm = true;
  v3.model.router_bias = true;
  v3.model.first_k_dense = 1;
  v3.model.dense_mlp_hidden = 96;
  v.push_back(v3);
  return v;
}

int64_t numel(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

std::string name(const Config& c) {
  return std::string(choice_name(c.model.attention)) + "/" + choice_name(c.model.ffn) +
         (c.model.tie_embeddings ? "/tied" : "/untied") +
         (c.model.gated_mlp() ? "/swiglu" : "") +
         (c.model.dropout_rate > 0 ? "/dropout" : "") + "/T" + std::to_string(c.model.T) +
         (c.optimizer_state_dtype == ModelDtype::Bfloat16 ? "/bf16-moments" : "");
}

TEST(Plan, CountsMatchBuiltModels) {
  for (const Config& c : variants()) {
    const ParamCount pc = count_params(c.model);
    EXPECT_EQ(built_param_count(c.model), pc.total) << name(c);
    EXPECT_EQ(stage_params(c.model, 1, 1, 0).total(), pc.total) << name(c);
    const MemoryPlan p = plan_memory(c, PlanDevice::Cpu);
    EXPECT_EQ(p.total_params, pc.total);
    if (c.model.ffn == FfnKind::Moe) EXPECT_LT(p.active_params, p.total_params) << name(c);
  }
}

// With multi-token prediction the last stage also holds the modules and (an
// untied model too) a copy of the embedding they read.
TEST(Plan, StagesSplitTheModelLikeTheBuiltStages) {
  for (Config c : variants()) for (const int64_t depth : {0, 2}) {
    c.model.mtp_depth = depth;
    c.model.blocks = 1;
    c.model.layers_per_block = 5;  // uneven over pp 2: 3 + 2 layers
    const auto ranges = partition_stages(c.model.n_layers(), 2);
    int64_t sum = 0;
    for (int64_t s = 0; s < 2; ++s) {
      const StageParams sp = stage_params(c.model, 2, 1, s);
      LayerFactory plain;
      Transformer stage(c.model, plain, ranges[static_cast<size_t>(s)]);
      EXPECT_EQ(sp.total(), numel(stage)) << name(c) << " stage " << s << " mtp_depth " << depth;
      sum += sp.total();
    }
    const bool copy = c.model.tie_embeddings || depth > 0;
    const int64_t copy_params = copy ? c.model.vocab_size * c.model.model_dimension : 0;
    EXPECT_EQ(sum, count_params(c.model).total + copy_params) << name(c) << " mtp_depth " << depth;
  }
}

// zbv's V: stage 0 holds the first and the last chunk, the embedding and
// the head; the plan counts what those built stages hold, and its bubble is
// the zero-bubble plans' own (below 1f1b's at the same mesh).
TEST(Plan, ZbvStagesAreTheBuiltVStages) {
  for (Config c : variants()) {
    c.model.blocks = 1;
    c.model.layers_per_block = 4;  // 2pp chunks of one layer at pp 2
    const auto ranges = partition_stages(c.model.n_layers(), 2, 2, /*v_shape=*/true);
    ASSERT_TRUE(ranges[0].has_head && ranges[0].has_embedding && !ranges[1].has_head) << name(c);
    for (int64_t s = 0; s < 2; ++s) {
      const StageParams sp = stage_params(c.model, 2, 1, s, 1, 2, /*v_shape=*/true);
      LayerFactory plain;
      Transformer stage(c.model, plain, ranges[static_cast<size_t>(s)]);
      EXPECT_EQ(sp.total(), numel(stage)) << name(c) << " stage " << s;
    }
    c.device.n_device_axis = {1, 2, 1};
    c.data.micro_batch_size = 1;
    c.pipeline_schedule = PipelineSchedule::OneFOneB;
    const MemoryPlan one_f_one_b = plan_memory(c, PlanDevice::Cpu);
    c.pipeline_schedule = PipelineSchedule::Zbv;
    const MemoryPlan zbv = plan_memory(c, PlanDevice::Cpu);
    EXPECT_EQ(zbv.virtual_stages, 2);
    EXPECT_GT(zbv.stages[0].params.total(), zbv.stages[1].params.total()) << name(c) << ": the head is on stage 0";
    EXPECT_LT(zbv.pipeline_bubble, one_f_one_b.pipeline_bubble) << name(c);
  }
}

// B carries attention's score and value gradients, W only the GEMMs': with
// short sequences the three passes cost the same, with long ones B grows
// and W shrinks against the forward; zbv's priced bubble follows.
TEST(Plan, PassCostsFollowAttentionsShare) {
  Config c = tiny(AttentionKind::Mha, FfnKind::Dense, false);
  c.model.T = 1;
  PassCostRatios r = pass_cost_ratios(c.model);
  EXPECT_NEAR(r.backward_input, 1.0, 0.01);
  EXPECT_NEAR(r.backward_weight, 1.0, 0.01);
  c.model.T = 1 << 16;
  r = pass_cost_ratios(c.model);
  EXPECT_GT(r.backward_input, 1.5);
  EXPECT_LT(r.backward_weight, 0.5);
  EXPECT_NEAR(r.backward_input + r.backward_weight, 2.0, 1e-9) << "a backward is twice a forward";
}

// The run's zero-bubble plans are made with pipeline_pass_costs (else the
// FLOP ratios, B plus a forward under full recomputation), and plan prices
// the plans the run makes: at pp 2 with 4 microbatches and a W 0.7 of a B,
// zbv's plans made with those lengths idle less than the equal-cost plans
// would on the same timeline.
TEST(Plan, ZeroBubblePlansFollowPipelinePassCosts) {
  Config c = tiny(AttentionKind::Mha, FfnKind::Dense, false);
  c.model.blocks = 1;
  c.model.layers_per_block = 4;
  c.device.n_device_axis = {1, 2, 1};
  c.data.train_batch_size = 4;
  c.data.micro_batch_size = 1;
  c.pipeline_schedule = PipelineSchedule::Zbv;
  const PassCostRatios r = pass_cost_ratios(c.model);
  PassCosts got = pipeline_pass_costs(c);
  EXPECT_EQ(got.forward, 1.0);
  EXPECT_EQ(got.backward_input, r.backward_input);
  EXPECT_EQ(got.backward_weight, r.backward_weight);
  c.activation_checkpointing = ActivationCheckpointing::Full;
  EXPECT_EQ(pipeline_pass_costs(c).backward_input, r.backward_input + 1.0) << "B recomputes the forward";
  c.activation_checkpointing = ActivationCheckpointing::None;

  c.pipeline_pass_costs = {1, 1, 0.7};
  got = pipeline_pass_costs(c);
  EXPECT_EQ(got.backward_weight, 0.7);
  const MemoryPlan p = plan_memory(c, PlanDevice::Cpu);
  EXPECT_TRUE(p.pass_costs_given);
  EXPECT_EQ(p.backward_weight_cost, 0.7);
  ASSERT_EQ(p.n_microbatches, 4);
  const double equal_plans = time_plans(zero_bubble_plans(ZeroBubble::V, 2, 4), 2, true, got).idle_fraction;
  EXPECT_LT(p.pipeline_bubble, equal_plans - 0.03);
  EXPECT_NEAR(p.pipeline_bubble, time_plans(zero_bubble_plans(ZeroBubble::V, 2, 4, true, got), 2, true, got).idle_fraction,
              1e-12);
  // The executor's plan for each stage is the one plan timed.
  for (int s = 0; s < 2; ++s) {
    const auto op = pipeline_plan(PipelineSchedule::Zbv, s, 2, 4, true, 2, got);
    const auto want = zero_bubble_plans(ZeroBubble::V, 2, 4, true, got)[static_cast<size_t>(s)];
    ASSERT_EQ(op.size(), want.size());
    for (size_t i = 0; i < op.size(); ++i) EXPECT_EQ(op[i].step, want[i].step);
  }
}

TEST(Plan, TensorParallelShardsAddUp) {
  for (const Config& c : variants()) {
    const StageParams one = stage_params(c.model, 1, 1, 0), two = stage_params(c.model, 1, 2, 0);
    EXPECT_EQ(two.replicated, one.replicated) << name(c);
    EXPECT_EQ(2 * two.split, one.split) << name(c);  // vocab 512 and every width divide by 2
  }
}

TEST(Plan, ZeroOneShardsTheOptimizerOverDp) {
  Config c = tiny(AttentionKind::Mha, FfnKind::Dense, true);
  c.device.n_device_axis = {4, 1, 1};
  const MemoryPlan z0 = plan_memory(c, PlanDevice::Cpu);
  c.zero_stage = 1;
  const MemoryPlan z1 = plan_memory(c, PlanDevice::Cpu);
  EXPECT_DOUBLE_EQ(z1.worst().optimizer * 4, z0.worst().optimizer);
  EXPECT_DOUBLE_EQ(z1.worst().weights, z0.worst().weights);
  EXPECT_DOUBLE_EQ(z1.worst().grads, z0.worst().grads);
  c.optimizer_state_dtype = ModelDtype::Bfloat16;  // bf16 moments: half of them
  EXPECT_DOUBLE_EQ(plan_memory(c, PlanDevice::Cpu).worst().optimizer * 2, z1.worst().optimizer);
}

// With one dp rank ZeRO and FSDP have nothing to shard: every stage runs as
// stage 0 (no FSDP gather buffer), and the report says so.
TEST(Plan, ZeroStagesOnOneDpRankAreStageZero) {
  Config c = tiny(AttentionKind::Mla, FfnKind::Moe, true);
  c.device.n_device_axis = {1, 1, 2};
  const MemoryPlan z0 = plan_memory(c, PlanDevice::Cuda);
  for (int64_t stage : {1, 2, 3}) {
    c.zero_stage = stage;
    EXPECT_EQ(c.zero_stage_on(1), 0);
    EXPECT_EQ(c.zero_stage_on(2), stage);
    const MemoryPlan z = plan_memory(c, PlanDevice::Cuda);
    EXPECT_DOUBLE_EQ(z.total_bytes(), z0.total_bytes()) << "zero_stage " << stage;
    EXPECT_DOUBLE_EQ(z.worst().gathered, 0.0) << "zero_stage " << stage;
    EXPECT_NE(plan_report(c, PlanDevice::Cuda, 0, false).find("nothing to shard with dp 1"), std::string::npos);
  }
  c.device.n_device_axis = {2, 1, 1};
  EXPECT_GT(plan_memory(c, PlanDevice::Cuda).worst().gathered, 0.0);  // dp 2: FSDP runs
}

// zero_stage 3 gathers the layers in bf16 under mixed precision (the running
// and the prefetched one: the fp32 root stays whole); fsdp_keep_gathered
// holds every layer gathered and adds whole fp32 layer gradients, stage 2 too.
TEST(Plan, FsdpGathersInBf16AndKeepGatheredCostsItsMemory) {
  Config c = tiny(AttentionKind::Mha, FfnKind::Dense, true);
  c.device.n_device_axis = {2, 1, 1};
  c.zero_stage = 3;
  c.model.model_dtype = ModelDtype::Float32;
  const StageMemory f32 = plan_memory(c, PlanDevice::Cuda).worst();
  c.model.model_dtype = ModelDtype::Bfloat16;
  const StageMemory b16 = plan_memory(c, PlanDevice::Cuda).worst();
  c.fsdp_keep_gathered = true;
  const StageMemory keep = plan_memory(c, PlanDevice::Cuda).worst();
  // Equal layers: the layers' parameters L and one layer's l from the fp32 plan.
  const double n = static_cast<double>(f32.params.total());
  const double per_layer = (f32.gathered - 4 * n) / (4 * 2 - 4 * c.model.n_layers());  // gathered = 4 (n - L) + 4 * 2 l
  const double L = per_layer * static_cast<double>(c.model.n_layers());
  ASSERT_GT(per_layer, 0);
  EXPECT_DOUBLE_EQ(b16.gathered, 4 * (n - L) + 2 * 2 * per_layer);
  EXPECT_DOUBLE_EQ(keep.gathered, 4 * (n - L) + 2 * L);
  EXPECT_DOUBLE_EQ(keep.grads, b16.grads + 4 * L);
  EXPECT_DOUBLE_EQ(b16.autocast_copies, 2 * (n - L));  // the layers read their gathered bf16 weights
  c.zero_stage = 2;
  const StageMemory two = plan_memory(c, PlanDevice::Cuda).worst();
  c.fsdp_keep_gathered = false;
  EXPECT_DOUBLE_EQ(two.grads, plan_memory(c, PlanDevice::Cuda).worst().grads + 4 * L);
}

// The precision line names the FP8 recipe (the start-up log prints the same
// PrecisionPolicy::describe).
TEST(Plan, PrecisionNamesTheFp8Recipe) {
  Config c = tiny(AttentionKind::Mha, FfnKind::Dense, true);
  c.model.model_dtype = ModelDtype::Bfloat16;
  EXPECT_EQ(plan_memory(c, PlanDevice::Cuda).precision.find("FP8"), std::string::npos);
  c.model.fp8_recipe = Fp8Recipe::Tensorwise;
  EXPECT_NE(plan_memory(c, PlanDevice::Cuda).precision.find("FP8 tensorwise"), std::string::npos);
  c.model.fp8_recipe = Fp8Recipe::Blockwise;
  EXPECT_NE(plan_memory(c, PlanDevice::Cuda).precision.find("FP8 blockwise"), std::string::npos);
}

// expert_parallel splits the routed experts (and only them) over its ranks;
// the count per rank matches what a rank of such a mesh builds.
TEST(Plan, ExpertParallelSplitsTheExperts) {
  Config c = tiny(AttentionKind::Mla, FfnKind::Moe, true);
  c.device.n_device_axis = {4, 1, 1};
  const StageParams one = stage_params(c.model, 1, 1, 0), two = stage_params(c.model, 1, 1, 0, 2);
  const int64_t E = c.model.n_experts, d = c.model.model_dimension, h = c.model.mlp_hidden;
  EXPECT_EQ(one.experts, c.model.n_layers() * E * 2 * d * h);  // w_in, w_out of every layer
  EXPECT_EQ(two.experts * 2, one.experts);
  EXPECT_EQ(one.split - two.split, one.experts / 2);
  EXPECT_EQ(two.replicated, one.replicated);
  const MemoryPlan p1 = plan_memory(c, PlanDevice::Cpu);
  c.device.expert_parallel = 2;
  const MemoryPlan p2 = plan_memory(c, PlanDevice::Cpu);
  EXPECT_DOUBLE_EQ(p2.worst().experts * 2, p1.worst().experts);
  EXPECT_DOUBLE_EQ(p1.worst().experts, 16.0 * static_cast<double>(one.experts));
  EXPECT_LT(p2.total_bytes(), p1.total_bytes());
  EXPECT_NE(plan_report(c, PlanDevice::Cpu, 0, false).find("expert_parallel 2"), std::string::npos);
  // ZeRO-1 shards the experts' moments over dp / expert_parallel = 2 ranks.
  c.zero_stage = 1;
  const MemoryPlan z = plan_memory(c, PlanDevice::Cpu);
  EXPECT_DOUBLE_EQ(z.worst().experts, 8.0 * static_cast<double>(two.experts) + 4.0 * static_cast<double>(two.experts));
}

TEST(Plan, CheckpointingAndTensorParallelCutActivations) {
  Config c = tiny(AttentionKind::Mha, FfnKind::Dense, true);
  c.model.blocks = 4;
  const MemoryPlan none = plan_memory(c, PlanDevice::Cpu);
  c.activation_checkpointing = ActivationCheckpointing::Full;
  const MemoryPlan full = plan_memory(c, PlanDevice::Cpu);
  EXPECT_LT(full.worst().activations, none.worst().activations);
  EXPECT_DOUBLE_EQ(full.worst().activations_none, none.worst().activations);

  c.activation_checkpointing = ActivationCheckpointing::None;
  c.device.n_device_axis = {1, 1, 2};
  const double tp2 = plan_memory(c, PlanDevice::Cpu).worst().activations;
  c.sequence_parallel = true;
  const double sp2 = plan_memory(c, PlanDevice::Cpu).worst().activations;
  EXPECT_LT(tp2, none.worst().activations);
  EXPECT_LT(sp2, tp2);
}

TEST(Plan, PipelineKeepsMoreMicrobatchesOnEarlyStages) {
  Config c = tiny(AttentionKind::Mha, FfnKind::Dense, false);
  c.device.n_device_axis = {1, 4, 1};
  c.data.micro_batch_size = 2;  // 16 / 2 = 8 microbatches
  const MemoryPlan f = plan_memory(c, PlanDevice::Cpu);
  ASSERT_EQ(f.stages.size(), 4u);
  EXPECT_EQ(f.stages[0].microbatches_in_flight, 4);
  EXPECT_EQ(f.stages[3].microbatches_in_flight, 1);
  c.pipeline_schedule = PipelineSchedule::Gpipe;
  EXPECT_EQ(plan_memory(c, PlanDevice::Cpu).stages[3].microbatches_in_flight, 8);
}

TEST(Plan, FlopsPerTokenIsNanoGptsEstimate) {
  const Config c = tiny(AttentionKind::Mha, FfnKind::Dense, true);
  const ModelConfig& m = c.model;
  const double want = 6.0 * static_cast<double>(count_params(m).total) +
                      12.0 * static_cast<double>(m.n_layers() * m.n_head * m.head_dim() * m.T);
  EXPECT_DOUBLE_EQ(flops_per_token(m), want);
}

// Each MTP depth adds its module's parameters (6 N), one layer's attention
// (12 H Q T) and one more pass of the shared head (6 d V).
TEST(Plan, FlopsPerTokenCountsTheMultiTokenPredictionModules) {
  const Config c = tiny(AttentionKind::Mha, FfnKind::Dense, true);
  ModelConfig m = c.model;
  const double plain = flops_per_token(m);
  const int64_t plain_params = count_params(m).total;
  m.mtp_depth = 2;
  const double per_depth_attention = 12.0 * static_cast<double>(m.n_head * m.head_dim() * m.T);
  const double head = 6.0 * static_cast<double>(m.model_dimension * m.vocab_size);
  EXPECT_DOUBLE_EQ(flops_per_token(m), plain + 6.0 * static_cast<double>(count_params(m).total - plain_params) +
                                           2 * (per_depth_attention + head));
}

TEST(Plan, KnownPeaks) {
  EXPECT_EQ(peak_tflops_for("NVIDIA H100 80GB HBM3"), 989.0);
  EXPECT_EQ(peak_tflops_for("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_EQ(peak_tflops_for("cpu"), 0.0);
}

// Counts the bytes the CPU allocator hands out and takes back on this thread
// while installed (c10 reports them to the profiler hook): `current` is what
// was allocated in the scope and is still alive.
struct CpuAllocations : c10::MemoryReportingInfoBase {
  int64_t current = 0, peak = 0;
  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    current += size;
    peak = std::max(peak, current);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

// Multi-token prediction (model/mtp.h) on the head's stage: each module
// adds, per token of a microbatch in flight, one layer of the model's kind,
// 8d for its norms and eh_proj's input (plan.cpp) and a cross-entropy buffer
// of vocab fp32 values. For the tiny dense MHA model (CPU's fused attention,
// no dropout) a layer keeps 6d (its two norms) + 5 H hd (q, k, v, the
// attention's output and its merged copy) + 2 hidden (gelu's input and
// output) elements. pp 2: the first stage's estimate does not change.
TEST(Plan, MultiTokenPredictionAddsItsModulesActivations) {
  Config c = tiny(AttentionKind::Mha, FfnKind::Dense, true);
  const ModelConfig& m = c.model;
  const double d = static_cast<double>(m.model_dimension), hidden = static_cast<double>(m.hidden_dim());
  const double heads = static_cast<double>(m.n_head * m.head_dim());
  const double tokens = static_cast<double>(c.data.micro_batch_size * m.T), e = 4;  // fp32
  const double layer = 6 * d + 5 * heads + 2 * hidden;
  const double per_module = tokens * (e * (layer + 8 * d) + 4.0 * static_cast<double>(m.vocab_size));
  for (const int pp : {1, 2}) {
    c.device.n_device_axis = {1, pp, 1};
    c.model.mtp_depth = 0;
    const MemoryPlan none = plan_memory(c, PlanDevice::Cpu);
    ASSERT_EQ(none.stages.back().microbatches_in_flight, 1) << "pp " << pp;
    for (const int64_t depth : {1, 2}) {
      c.model.mtp_depth = depth;
      const MemoryPlan with = plan_memory(c, PlanDevice::Cpu);
      const double k = static_cast<double>(depth);
      EXPECT_DOUBLE_EQ(with.stages.back().activations_none - none.stages.back().activations_none, k * per_module)
          << "pp " << pp << " depth " << depth;
      EXPECT_DOUBLE_EQ(with.stages.back().logits - none.stages.back().logits,
                       k * tokens * 4.0 * static_cast<double>(m.vocab_size));
      if (pp == 2) EXPECT_DOUBLE_EQ(with.stages[0].activations_none, none.stages[0].activations_none);
    }
  }
}

// The bytes allocated during the forward that are still alive when it
// returns (the loss holds the graph), and their peak, with the multi-token
// prediction modules' losses when c has them.
struct Kept {
  double current = 0, peak = 0;
};
Kept kept_by_forward(const Config& c) {
  at::set_num_threads(1);  // allocations on this thread only
  LayerFactory plain;
  Transformer model(c.model, plain);
  model.train();
  const int64_t B = c.data.micro_batch_size, T = c.model.T;
  const auto tokens = at::randint(c.model.vocab_size, {B, T}, at::kLong);
  const auto targets = at::randint(c.model.vocab_size, {B, T}, at::kLong);
  auto tracker = std::make_shared<CpuAllocations>();
  at::Tensor loss;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, tracker);
    ForwardAux aux;
    const at::Tensor h = model.forward_layers(model.embed(tokens), &aux);
    loss = model.token_losses(h, targets).mean();
    if (c.model.mtp_depth > 0)
      for (const at::Tensor& l : model.mtp_token_losses(h, mtp_targets(tokens, targets, c.model.mtp_depth, -1), &aux))
        loss = loss + l.mean();
  }
  const Kept kept{static_cast<double>(tracker->current), static_cast<double>(tracker->peak)};
  loss.backward();
  return kept;
}

// The modules' activations against what their forward keeps: the dense MHA
// model and DeepSeek-V3's options (MLA, an MoE module), at depth 1 and 2.
TEST(Plan, MultiTokenPredictionActivationsMatchWhatForwardKeeps) {
  std::vector<Config> configs = {tiny(AttentionKind::Mha, FfnKind::Dense, true), variants().back()};
  for (Config c : configs)
    for (const int64_t depth : {1, 2}) {
      c.model.blocks = 2;
      c.data.micro_batch_size = 4;
      c.model.mtp_depth = depth;
      const double measured = kept_by_forward(c).current;
      const double planned = plan_memory(c, PlanDevice::Cpu).worst().activations_none;
      std::printf("activations %-16s mtp_depth %lld planned %8.0f KiB, forward kept %8.0f KiB (ratio %.2f)\n",
                  name(c).c_str(), static_cast<long long>(depth), planned / 1024, measured / 1024, planned / measured);
      EXPECT_NEAR(planned / measured, 1.0, 0.20) << name(c) << " mtp_depth " << depth;
    }
}

// Activations a forward keeps for backward: the bytes allocated during the
// forward that are still alive when it returns (the loss holds the graph).
TEST(Plan, ActivationEstimateMatchesWhatForwardKeeps) {
  std::vector<Config> configs = variants();
  // Dropout masks; longer sequences (MLA's s*s scores on CPU).
  for (AttentionKind att : {AttentionKind::Mha, AttentionKind::Mla}) {
    Config c = tiny(att, FfnKind::Dense, true);
    c.model.dropout_rate = 0.1;
    configs.push_back(c);
    c.model.dropout_rate = 0;
    c.model.T = c.data.T = 128;
    configs.push_back(c);
  }
  for (Config c : configs) {
    c.model.blocks = 2;
    c.data.micro_batch_size = 4;
    const Kept kept = kept_by_forward(c);
    const double measured = kept.current;
    const double planned = plan_memory(c, PlanDevice::Cpu).worst().activations_none;
    std::printf("activations %-16s planned %8.0f KiB, forward kept %8.0f KiB (ratio %.2f), peak %8.0f KiB\n",
                name(c).c_str(), planned / 1024, measured / 1024, planned / measured, kept.peak / 1024.0);
    // plan counts the MoE capacity slots (every expert's C rows per sequence,
    // filled or not: planned and kept grow alike with capacity_factor). Not
    // modelled: the routing's gather/scatter buffers (~4.5 d per token of an
    // MoE layer; MoE ratios 0.84-0.94) and MLA's over-count (1.08-1.13).
    EXPECT_NEAR(planned / measured, 1.0, 0.20) << name(c);
  }
}

// The static part (weights + grads + Adam moments) of the plan against the
// tensors a tiny CPU Trainer holds after one step.
TEST(Plan, StaticBytesMatchATinyTrainer) {
  const fs::path dir = fs::temp_directory_path() / "meshtrain_plan_test";
  fs::remove_all(dir);
  const std::string corpus = "/usr/share/games/fortunes/computers";
  if (!fs::exists(corpus)) GTEST_SKIP() << corpus << " not installed";
  PrepareOptions prep;
  prep.inputs = {corpus};
  prep.output_dir = (dir / "data").string();
  prep.vocab_size = 320;
  prepare_data(prep);

  int argc = 1;
  char arg0[] = "plan_test";
  char* args[] = {arg0, nullptr};
  char** argv = args;
  Runtime runtime(&argc, &argv);
  // The MoE model also with bf16 moments (optimizer_state_dtype): 4 B/param.
  Config bf16_moments = tiny(AttentionKind::Mla, FfnKind::Moe, false);
  bf16_moments.optimizer_state_dtype = ModelDtype::Bfloat16;
  for (const Config& base :
       {tiny(AttentionKind::Mha, FfnKind::Dense, true), tiny(AttentionKind::Mla, FfnKind::Moe, false), bf16_moments}) {
    Config c = base;
    c.data.data_dir = prep.output_dir;
    c.model.vocab_size = 320;
    c.output_dir = (dir / "runs").string();
    c.device.device = DeviceChoice::Cpu;
    SessionOptions o;
    o.fresh = true;
    o.quiet = true;
    Trainer trainer(c, runtime, o);
    trainer.train_step();
    trainer.adamw().step(learning_rate(c.lr, 0));
    double weights = 0, grads = 0, moments = 0;
    for (const auto& p : trainer.model().params) {
      weights += static_cast<double>(p.tensor.nbytes());
      if (p.tensor.grad().defined()) grads += static_cast<double>(p.tensor.grad().nbytes());
    }
    for (const auto& p : trainer.adamw().params())
      moments += static_cast<double>(p.exp_avg.nbytes() + p.exp_avg_sq.nbytes());
    const StageMemory w = plan_memory(c, PlanDevice::Cpu).worst();
    std::printf("static %-16s planned %.0f B (w %.0f g %.0f o %.0f), measured %.0f B (w %.0f g %.0f o %.0f)\n",
                name(c).c_str(), w.static_bytes(), w.weights, w.grads, w.optimizer, weights + grads + moments,
                weights, grads, moments);
    EXPECT_NEAR(w.static_bytes() / (weights + grads + moments), 1.0, 0.10) << name(c);
    EXPECT_DOUBLE_EQ(w.weights, weights) << name(c);
    EXPECT_DOUBLE_EQ(w.optimizer, moments) << name(c);
  }
  fs::remove_all(dir);
}

// Issue 47: d 65536 reached the allocator (a libtorch stack trace); the plan
// is compared with the memory first, and the message names the keys.
TEST(MemoryCheck, APlanBeyondTheBudgetIsRefusedNamingTheKeys) {
  Config c = load_config(std::string(MT_SOURCE_DIR) + "/configs/tiny.json").config;
  const MemoryBudget gib{1024.0 * 1024 * 1024, "a 1 GiB test budget"};
  check_memory_fits(c, PlanDevice::Cpu, gib);  // the tiny model fits
  c.model.model_dimension = 65536;
  try {
    check_memory_fits(c, PlanDevice::Cpu, gib);
    ADD_FAILURE() << "d 65536 fits 1 GiB?";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("more than a 1 GiB test budget"), std::string::npos) << m;
    EXPECT_NE(m.find("model_config.model_dimension 65536"), std::string::npos) << m;
  }
  c = load_config(std::string(MT_SOURCE_DIR) + "/configs/tiny.json").config;
  c.data.train_batch_size = c.data.micro_batch_size = 4096;
  try {
    check_memory_fits(c, PlanDevice::Cpu, gib);
    ADD_FAILURE() << "4096 sequences fit 1 GiB?";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data_config.train_batch_size 4096"), std::string::npos) << e.what();
  }
  check_memory_fits(c, PlanDevice::Cpu, MemoryBudget{});  // unknown budget: nothing checked
  const MemoryBudget host = rank_memory_budget(PlanDevice::Cpu, 2, 0);
  EXPECT_GT(host.bytes, 0);
  EXPECT_NE(host.source.find("shared by its 2 ranks"), std::string::npos) << host.source;
}

}  // namespace
}  // namespace meshtrain

// bench --profile sorts kernels by name: CUDA kernels as CUPTI names them and
// aten operators on CPU.
TEST(Profile, KernelCategories) {
  using meshtrain::kernel_category;
  EXPECT_EQ(kernel_category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), "gemm");
  EXPECT_EQ(kernel_category("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"), "gemm");
  EXPECT_EQ(kernel_category("aten::addmm"), "gemm");
  EXPECT_EQ(kernel_category("aten::mm"), "gemm");
  EXPECT_EQ(kernel_category("aten::mm_backward_like"), "other");  // exact names only on CPU
  EXPECT_EQ(kernel_category("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>"), "attention");
  EXPECT_EQ(kernel_category("aten::_scaled_dot_product_flash_attention_for_cpu"), "attention");
  EXPECT_EQ(kernel_category("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"), "comm");
  EXPECT_EQ(kernel_category("Memcpy DtoD (Device -> Device)"), "copy");
  EXPECT_EQ(kernel_category("aten::copy_"), "copy");
  EXPECT_EQ(kernel_category("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"),
            "other");
}
