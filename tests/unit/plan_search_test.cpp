// The cluster planner: the step model against the meta device's counts and
// against itself (links, overlap, the bubble), the presets, and the search's
// promises (every mesh divides N, validates, fits; ranked; refusals named).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "meshtrain/bench/meta_bench.h"
#include "meshtrain/config/load.h"
#include "meshtrain/dist/runtime.h"
#include "meshtrain/parallel/pipeline_plan.h"
#include "meshtrain/perf/plan.h"
#include "meshtrain/perf/plan_search.h"
#include "meshtrain/perf/step_model.h"

namespace meshtrain {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Config load(const std::string& file, const std::vector<std::string>& sets = {}) {
  return load_config(std::string(MT_SOURCE_DIR) + "/" + file, sets).config;
}

Hardware h100() { return hardware_preset("h100-sxm"); }

TEST(StepModel, PresetsAndRefusal) {
  EXPECT_EQ(h100().peak_tflops, 989);
  EXPECT_EQ(hardware_preset("a100-80").peak_tflops, 312);
  EXPECT_EQ(hardware_preset("v100-32").peak_tflops, 125);
  EXPECT_GT(hardware_preset("h200").memory_gib, 130);
  try {
    hardware_preset("h900");
    FAIL() << "an unknown preset must be refused";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("h900"), std::string::npos) << m;
    for (const auto& n : hardware_preset_names()) EXPECT_NE(m.find(n), std::string::npos) << m;
  }
}

// The compute efficiencies are the meta model's: one fit, two users.
TEST(StepModel, ComputeAssumptionsAreTheMetaModels) {
  const StepAssumptions a;
  const MetaBenchOptions m;
  EXPECT_EQ(a.gemm_efficiency, m.efficiency);
  EXPECT_EQ(a.attention_efficiency, m.attention_efficiency);
  EXPECT_EQ(a.memory_efficiency, m.memory_efficiency);
  EXPECT_EQ(a.kernel_gap_us, m.kernel_gap_us);
  EXPECT_EQ(h100().peak_tflops, m.peak_tflops);
  EXPECT_EQ(h100().hbm_tbps, m.bandwidth_tbps);
}

// One rank, no collectives: the analytic counts against a meta-device step
// of the same config (bench --device meta). FLOPs follow the shapes exactly;
// the other kernels' bytes and the kernel counts are fitted formulas.
TEST(StepModel, OneRankMatchesTheMetaDevice) {
  int argc = 1;
  char arg0[] = "plan_search_test";
  char* args[] = {arg0, nullptr};
  char** argv = args;
  Runtime runtime(&argc, &argv);
  const std::vector<std::pair<std::string, Config>> configs = {
      {"gpt2-124m", load("configs/gpt2-124m.json")},
      {"gpt2 swiglu gqa, 4 microbatches",
       load("configs/gpt2-124m.json", {"model_config.mlp_activation=swiglu", "model_config.mlp_hidden=2048",
                                       "model_config.n_kv_head=4", "data_config.micro_batch_size=8"})},
      {"gpt2 full recomputation", load("configs/gpt2-124m.json", {"activation_checkpointing=full"})},
      {"gpt2 moe 8 experts",
       load("configs/gpt2-124m.json", {"model_config.ffn=moe", "model_config.n_experts=8", "model_config.k=2",
                                       "model_config.mlp_hidden=768", "model_config.n_shared=1"})},
      {"jaxformer moe1B", load("configs/jaxformer/moe1B.json", {"device_config.n_device_axis=[1,1,1]"})},
      {"gpt2 two MTP modules", load("configs/gpt2-124m.json", {"model_config.mtp_depth=2"})},
  };
  for (const auto& [name, cfg] : configs) {
    const MetaBenchResult m = run_meta_bench(cfg, runtime, MetaBenchOptions{});
    const StepEstimate e = estimate_step(cfg, h100(), StepAssumptions{});
    const double mbs = static_cast<double>(e.n_microbatches * cfg.grad_step);
    const double ms = (e.parts.compute + e.parts.optimizer) * 1e3;
    std::printf("%-34s GEMM %7.3f / %7.3f TFLOP, attention %6.3f / %6.3f, other %7.2f / %7.2f GB, kernels "
                "%6.0f / %6lld, step %7.1f / %7.1f ms (model / meta)\n",
                name.c_str(), e.gemm_tflop * mbs, m.totals.gemm_flop / 1e12, e.attention_tflop * mbs,
                m.totals.attention_flop / 1e12, e.other_gb * mbs, m.totals.other_bytes / 1e9, e.kernels * mbs,
                static_cast<long long>(m.totals.kernels), ms, m.est_step_ms);
    EXPECT_NEAR(e.gemm_tflop * mbs / (m.totals.gemm_flop / 1e12), 1.0, 0.03) << name;
    EXPECT_NEAR(e.attention_tflop * mbs / (m.totals.attention_flop / 1e12), 1.0, 0.03) << name;
    EXPECT_NEAR(e.kernels * mbs / static_cast<double>(m.totals.kernels), 1.0, 0.25) << name;
    EXPECT_NEAR(ms / m.est_step_ms, 1.0, 0.15) << name;
  }
}

Config gpt2_on(int64_t dp, int64_t pp, int64_t tp, std::vector<std::string> sets = {}) {
  sets.push_back("device_config.n_device_axis=[" + std::to_string(dp) + "," + std::to_string(pp) + "," +
                 std::to_string(tp) + "]");
  sets.push_back("data_config.train_batch_size=512");
  sets.push_back("data_config.val_batch_size=512");
  return load("configs/gpt2-124m.json", sets);
}

TEST(StepModel, PartsAddUpAndLinksFollowTheRankOrder) {
  const StepEstimate e = estimate_step(gpt2_on(4, 2, 2, {"data_config.micro_batch_size=8"}), h100(), {});
  EXPECT_NEAR(e.parts.sum(), e.step_s, 1e-12);
  EXPECT_EQ(e.world, 16);
  // tp 2 and the dp group (tp x dp = 8 ranks) sit in a node of 8; pp's
  // stride is 8, so the 2 stages are in different nodes.
  EXPECT_TRUE(e.links.tp);
  EXPECT_TRUE(e.links.dp);
  EXPECT_FALSE(e.links.pp);
  Hardware four = h100();
  four.gpus_per_node = 4;
  const StepEstimate f = estimate_step(gpt2_on(4, 2, 2, {"data_config.micro_batch_size=8"}), four, {});
  EXPECT_TRUE(f.links.tp);
  EXPECT_FALSE(f.links.dp);
  EXPECT_GT(f.parts.dp, e.parts.dp);  // the network is slower than NVLink
}

// The bubble is the schedule's own: 1F1B leaves (pp - 1) / (n_mb + pp - 1)
// of a round idle; interleaving shrinks it.
TEST(StepModel, BubbleFromTheSchedule) {
  const StepEstimate one = estimate_step(gpt2_on(16, 4, 1, {"data_config.micro_batch_size=4"}), h100(), {});
  EXPECT_EQ(one.n_microbatches, 8);
  EXPECT_NEAR(one.bubble_fraction, 3.0 / 11.0, 1e-9);
  const StepEstimate il = estimate_step(
      gpt2_on(16, 4, 1, {"data_config.micro_batch_size=4", "pipeline_schedule=interleaved", "virtual_stages=3"}),
      h100(), {});
  EXPECT_LT(il.bubble_fraction, one.bubble_fraction);
  EXPECT_GT(il.bubble_fraction, 0);
  EXPECT_EQ(estimate_step(gpt2_on(64, 1, 1), h100(), {}).bubble_fraction, 0);
}

// zero_stage 0 hides its buckets under the last backward but the last one;
// without overlap_grad_reduce, or ZeRO-1, nothing is hidden.
TEST(StepModel, DataParallelOverlap) {
  const auto dp = [](std::vector<std::string> sets) {
    sets.push_back("data_config.micro_batch_size=32");  // one microbatch: 512 / dp 16
    return estimate_step(gpt2_on(16, 1, 1, sets), h100(), {}).parts.dp;
  };
  const double overlapped = dp({}), exposed = dp({"overlap_grad_reduce=false"}), zero1 = dp({"zero_stage=1"});
  EXPECT_GT(overlapped, 0);
  EXPECT_LT(overlapped, exposed);
  EXPECT_GT(zero1, overlapped);
}

// tp across nodes runs its all-reduces on the network: slower than inside.
TEST(StepModel, TensorParallelAcrossNodesIsSlower) {
  Hardware two = h100();
  two.gpus_per_node = 2;
  const Config c = gpt2_on(2, 1, 4);
  EXPECT_TRUE(estimate_step(c, h100(), {}).links.tp);
  const StepEstimate across = estimate_step(c, two, {});
  EXPECT_FALSE(across.links.tp);
  EXPECT_GT(across.parts.tp, estimate_step(c, h100(), {}).parts.tp * 5);
}

// plan_memory takes the closed form of the schedules' peak live microbatches
// beyond 2^14 plan steps (the search would spend minutes replaying plans):
// it must be what the plans themselves hold, stage by stage.
TEST(StepModel, PeakLiveClosedFormIsThePlans) {
  for (int64_t pp : {2, 3, 4, 8})
    for (int64_t n_mb : {1, 2, 3, 4, 8, 16, 24})
      for (int64_t st = 0; st < pp; ++st) {
        for (auto s : {PipelineSchedule::Gpipe, PipelineSchedule::OneFOneB})
          EXPECT_EQ(schedule_peak_live_closed_form(s, st, pp, n_mb, 1),
                    plan_peak_live(pipeline_plan(s, static_cast<int>(st), static_cast<int>(pp), n_mb, true, 1)))
              << choice_name(s) << " pp " << pp << " n_mb " << n_mb << " stage " << st;
        if (n_mb % pp != 0) continue;
        for (int64_t v : {2, 3, 4})
          EXPECT_EQ(schedule_peak_live_closed_form(PipelineSchedule::Interleaved, st, pp, n_mb, v),
                    plan_peak_live(pipeline_plan(PipelineSchedule::Interleaved, static_cast<int>(st),
                                                 static_cast<int>(pp), n_mb, true, v)))
              << "interleaved pp " << pp << " n_mb " << n_mb << " v " << v << " stage " << st;
      }
}

SearchOptions on(int64_t gpus, const Hardware& hw) {
  SearchOptions o;
  o.gpus = gpus;
  o.hardware = hw;
  return o;
}

// Every listed mesh uses exactly N GPUs, keeps tp in a node, passes the
// config's own validation, fits by the memory model, and the list is ranked.
TEST(PlanSearch, EveryCandidateDividesNValidatesAndFits) {
  const Config base = load("configs/gpt2-124m.json", {"data_config.train_batch_size=256",
                                                      "data_config.val_batch_size=256"});
  const SearchOptions o = on(16, h100());
  const SearchResult r = search_meshes(base, o);
  ASSERT_FALSE(r.candidates.empty());
  EXPECT_EQ(r.evaluated, r.too_big + static_cast<int64_t>(r.candidates.size()));
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const Candidate& c = r.candidates[i];
    EXPECT_EQ(c.dp * c.pp * c.tp * c.cp, 16);
    EXPECT_LE(c.tp, 8);
    const Config cc = candidate_config(base, c);
    EXPECT_NO_THROW(validate(cc));
    EXPECT_LE(plan_memory(cc, PlanDevice::Cuda).total_bytes(), o.hardware.memory_gib * kGiB * 0.9);
    if (i > 0) EXPECT_GE(r.candidates[i - 1].estimate.tokens_per_sec, c.estimate.tokens_per_sec);
  }
  // A 124M model fits one GPU: the best mesh is data parallel.
  EXPECT_EQ(r.candidates.front().dp * r.candidates.front().cp, 16);
}

TEST(PlanSearch, MoeSearchesExpertParallelism) {
  const Config base = load("configs/jaxformer/moe1B.json");
  const SearchResult r = search_meshes(base, on(8, h100()));
  ASSERT_FALSE(r.candidates.empty());
  EXPECT_TRUE(std::any_of(r.candidates.begin(), r.candidates.end(), [](const Candidate& c) { return c.ep > 1; }));
  for (const Candidate& c : r.candidates) EXPECT_EQ((c.dp * c.cp) % c.ep, 0);
}

TEST(PlanSearch, Refusals) {
  const Config base = load("configs/gpt2-124m.json");
  try {
    search_meshes(base, on(12, h100()));
    FAIL() << "12 GPUs of 8 a node must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--gpus-per-node"), std::string::npos) << e.what();
  }
  // A 104B model on 8 GPUs of 40 GB: nothing fits, and each family says why.
  const Config big = load("configs/published/bigscience-tr8-104b.json");
  const SearchResult r = search_meshes(big, on(8, hardware_preset("a100-40")));
  EXPECT_TRUE(r.candidates.empty());
  ASSERT_FALSE(r.rejected.empty());
  for (const RejectedFamily& f : r.rejected) EXPECT_FALSE(f.why.empty()) << f.tp << " x " << f.pp;
}

// The seed's question: BigScience's 104B on 128 GPUs of 32 GB, 4 a node.
TEST(PlanSearch, BigScience104bOn128V100s) {
  Hardware v100 = hardware_preset("v100-32");
  v100.gpus_per_node = 4;
  SearchOptions o = on(128, v100);
  o.zero_stages = {0, 1};  // Megatron-DeepSpeed's ZeRO-1, as the run had
  const SearchResult r = search_meshes(load("configs/published/bigscience-tr8-104b.json"), o);
  ASSERT_FALSE(r.candidates.empty());
  int64_t smallest = 1 << 20;
  for (const Candidate& c : r.candidates) {
    EXPECT_LE(c.tp, 4);
    if (c.tp == 4) smallest = std::min(smallest, c.pp);
  }
  std::printf("104B on 128 x v100-32: %zu meshes fit, smallest pp at tp 4: %lld, best: dp %lld pp %lld tp %lld\n",
              r.candidates.size(), static_cast<long long>(smallest),
              static_cast<long long>(r.candidates.front().dp), static_cast<long long>(r.candidates.front().pp),
              static_cast<long long>(r.candidates.front().tp));
  // Below the smallest pp, the tp 4 family is refused for its memory.
  for (const RejectedFamily& f : r.rejected)
    if (f.tp == 4 && f.pp < smallest) EXPECT_NE(f.why.find("GiB"), std::string::npos) << f.why;
  EXPECT_TRUE(std::any_of(r.rejected.begin(), r.rejected.end(), [](const RejectedFamily& f) {
    return f.tp == 8 && f.why.find("spans nodes") != std::string::npos;
  }));
}

}  // namespace
}  // namespace meshtrain
