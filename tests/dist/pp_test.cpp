// Pipeline parallelism: every pipeline mesh and schedule gives the losses of
// one process; plans never deadlock under blocking send/recv; 1f1b holds at
// most pp - stage microbatches, gpipe all of them; misconfigurations throw on
// every rank instead of hanging.
#include <gtest/gtest.h>

#include <cstdio>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/pipeline.h"
#include "meshtrain/parallel/pipeline_plan.h"
#include "meshtrain/parallel/tensor_parallel.h"
#include "parity.h"
#include "round_bench.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("pp-data");
const std::vector<PipelineSchedule> kSchedules = {PipelineSchedule::Gpipe, PipelineSchedule::OneFOneB};

void expect_same(const test::Curve& ref, const test::Curve& got, const std::string& what) {
  test::expect_same_curve(ref, got, 1e-5, what);
}

Config base_config(const std::string& name) {
  Config c = test::tiny_config(test::synthetic_data(kData, 96), name);
  c.model.blocks = 4;  // 8 layers: one per stage at np 8
  return c;
}

std::string mesh_name(int dp, int pp, int tp, PipelineSchedule schedule) {
  return "(" + std::to_string(dp) + "," + std::to_string(pp) + "," + std::to_string(tp) + ") " + choice_name(schedule);
}

// Trains cfg on (dp, pp, tp) with both schedules and compares with `ref`.
void expect_parity(const Config& cfg, const test::Curve& ref, int dp, int pp, int tp) {
  for (const auto& schedule : kSchedules) {
    Config c = test::with_mesh(cfg, dp, pp, tp);
    c.pipeline_schedule = schedule;
    c.name += "-" + std::to_string(dp) + std::to_string(pp) + std::to_string(tp) + choice_name(schedule);
    expect_same(ref, test::train_losses(c), mesh_name(dp, pp, tp, schedule));
  }
}

// Replays every stage's plan with rendezvous send/recv (a send completes only
// when its receiver is at the matching receive): true if all plans finish.
bool plans_complete(PipelineSchedule schedule, int pp, int64_t n_mb, bool backward, std::string* why) {
  std::vector<std::vector<PipeOp>> plans;
  for (int s = 0; s < pp; ++s) plans.push_back(pipeline_plan(schedule, s, pp, n_mb, backward));
  std::vector<size_t> pc(static_cast<size_t>(pp), 0);
  auto compute = [](PipeStep k) { return k == PipeStep::Forward || k == PipeStep::Backward; };
  for (;;) {
    bool progress = false, done = true;
    for (int s = 0; s < pp; ++s) {
      auto& p = plans[static_cast<size_t>(s)];
      auto& i = pc[static_cast<size_t>(s)];
      while (i < p.size() && compute(p[i].step)) ++i, progress = true;
      if (i >= p.size()) continue;
      done = false;
      const PipeOp op = p[i];
      int peer = s;
      PipeStep want = op.step;
      switch (op.step) {
        case PipeStep::SendForward: peer = s + 1; want = PipeStep::RecvForward; break;
        case PipeStep::RecvForward: peer = s - 1; want = PipeStep::SendForward; break;
        case PipeStep::SendBackward: peer = s - 1; want = PipeStep::RecvBackward; break;
        case PipeStep::RecvBackward: peer = s + 1; want = PipeStep::SendBackward; break;
        default: break;
      }
      if (peer < 0 || peer >= pp) {
        *why = "stage " + std::to_string(s) + " " + step_name(op.step) + " has no peer";
        return false;
      }
      auto& q = plans[static_cast<size_t>(peer)];
      auto& j = pc[static_cast<size_t>(peer)];
      if (j < q.size() && q[j].step == want) {
        if (q[j].microbatch != op.microbatch) {
          *why = "stage " + std::to_string(s) + " " + step_name(op.step) + " of microbatch " +
                 std::to_string(op.microbatch) + " meets microbatch " + std::to_string(q[j].microbatch);
          return false;
        }
        ++i, ++j, progress = true;
      }
    }
    if (done) return true;
    if (!progress) {
      *why = "deadlock";
      return false;
    }
  }
}

}  // namespace

TEST(PipelinePlan, NeverDeadlocksUnderBlockingSendRecv) {
  for (const auto& schedule : kSchedules)
    for (bool backward : {true, false})
      for (int pp = 1; pp <= 8; ++pp)
        for (int64_t n_mb = 1; n_mb <= 12; ++n_mb) {
          std::string why;
          EXPECT_TRUE(plans_complete(schedule, pp, n_mb, backward, &why))
              << schedule << " pp " << pp << " n_mb " << n_mb << " backward " << backward << ": " << why;
          for (int s = 0; s < pp; ++s) {
            const int64_t peak = plan_peak_live(pipeline_plan(schedule, s, pp, n_mb, backward));
            const int64_t want = !backward                              ? 1
                                 : schedule == PipelineSchedule::Gpipe ? n_mb
                                                                       : std::min<int64_t>(pp - s, n_mb);
            EXPECT_EQ(peak, want) << schedule << " stage " << s << " of " << pp << ", " << n_mb << " microbatches";
          }
        }
  EXPECT_THROW(pipeline_plan(PipelineSchedule::Interleaved, 0, 2, 4, true), Error);
}

TEST(Pipeline, TiedHeadCopyStartsEqualToEmbedding) {
  const int n = test_runtime().size();
  Config cfg = base_config("pp-tied-init");
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  const auto pm_owned = build_parallel_model(cfg, mesh);
  ParallelModel& pm = *pm_owned;
  auto self = split_communicator(*world, world->rank(), 0);
  Mesh one(*self, MeshShape{1, 1, 1});
  const auto ref_owned = build_parallel_model(cfg, one);
  ParallelModel& ref = *ref_owned;
  const auto ref_params = ref.model->named_parameters();
  const at::Tensor want = ref_params["embed.weight"];
  const bool owns = mesh.is_first_stage() || mesh.is_last_stage();
  const auto params = pm.model->named_parameters();
  const auto* p = params.find("embed.weight");
  ASSERT_EQ(p != nullptr, owns) << "stage " << mesh.coord().pp;
  if (p) EXPECT_TRUE(at::equal(*p, want)) << "stage " << mesh.coord().pp;
  if (mesh.is_last_stage()) {
    int copies = 0;
    for (const auto& info : pm.params) copies += info.layout.global_name == "embed.weight" && info.layout.tied_copy;
    EXPECT_EQ(copies, 1) << "the last stage's head copy is marked as a tied copy";
  }
}

TEST(Pipeline, DenseMatchesOneProcess) {
  const int n = test_runtime().size();
  Config cfg = base_config("pp-dense");
  cfg.data.micro_batch_size = 2;  // dp 1: 4 microbatches (more than pp 2, equal to 4, fewer than 8)
  const auto ref = test::single_process_losses(cfg);
  expect_parity(cfg, ref, 1, n, 1);
  if (n >= 4) {
    cfg.data.micro_batch_size = 1;  // dp 2: 4 microbatches per dp rank
    expect_parity(cfg, ref, 2, n / 2, 1);
  }
  if (n == 4) expect_parity(cfg, ref, 1, 2, 2);
  if (n == 8) {
    expect_parity(cfg, ref, 2, 2, 2);
  }
}

TEST(Pipeline, UntiedEmbeddingsMatchOneProcess) {
  const int n = test_runtime().size();
  Config cfg = base_config("pp-untied");
  cfg.model.tie_embeddings = false;
  cfg.data.micro_batch_size = 2;
  expect_parity(cfg, test::single_process_losses(cfg), 1, n, 1);
}

TEST(Pipeline, UnevenSplitMatchesOneProcess) {
  const int n = test_runtime().size();
  Config cfg = base_config("pp-uneven");
  cfg.model.blocks = 5;  // 5 layers on 2 stages: 3 + 2
  cfg.model.layers_per_block = 1;
  cfg.data.micro_batch_size = 1;
  expect_parity(cfg, test::single_process_losses(cfg), n / 2, 2, 1);
}

TEST(Pipeline, MoeMlaMatchesOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::moe_mla(base_config("pp-moe-mla"));
  cfg.model.blocks = 2;
  cfg.data.micro_batch_size = 1;
  // Each stage adds its own layers' aux loss to its backward; a stage that
  // dropped it would drift from the reference within a few steps.
  const auto ref = test::single_process_losses(cfg);
  expect_parity(cfg, ref, n / 2, 2, 1);
  // The whole 3-D mesh with tensor parallelism too (4 layers, 2 blocks: one
  // rope-less MLA layer per stage).
  if (n == 8) expect_parity(cfg, ref, 2, 2, 2);
}

// Jaxformer's architecture (configs/tiny-jaxformer.json): 4 layers in 2
// blocks, so every stage of pp 2 holds one dense rope layer and one rope-less
// MoE layer; on 8 ranks the published mesh shape (dp, pp, tp) = (2, 2, 2).
TEST(Pipeline, JaxformerMatchesOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::jaxformer(base_config("pp-jaxformer"));
  cfg.data.micro_batch_size = 1;
  const auto ref = test::single_process_losses(cfg);
  expect_parity(cfg, ref, n / 2, 2, 1);
  if (n == 4) expect_parity(cfg, ref, 1, 2, 2);
  if (n == 8) expect_parity(cfg, ref, 2, 2, 2);
  EXPECT_LT(ref.back(), ref.front()) << "the tiny Jaxformer model learns";
}

// run_round on a built model: activations held at once per stage, the same
// gradients from both schedules, and a forward-only round for evaluation.
// DeepSeek-V3's options: the dense first layer sits on stage 0 only.
TEST(Pipeline, DeepSeekV3OptionsMatchOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::deepseek_v3(base_config("pp-v3"));
  cfg.model.blocks = 2;
  cfg.data.micro_batch_size = 1;
  const auto ref = test::single_process_losses(cfg);
  expect_parity(cfg, ref, n / 2, 2, 1);
  if (n == 8) expect_parity(cfg, ref, 2, 2, 2);
}

TEST(Pipeline, InFlightMicrobatchesPerSchedule) {
  const int n = test_runtime().size();
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  const int stage = mesh.coord().pp;
  Config cfg = base_config("pp-inflight");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor inputs = at::randint(0, 96, {8, 16}, gen, at::kLong);
  const at::Tensor targets = at::randint(0, 96, {8, 16}, gen, at::kLong);
  RoundSpec spec;
  spec.ce_scale = 1.0 / (8 * 16);
  for (int64_t micro : {1, 4}) {
    const int64_t n_mb = 8 / micro;
    std::vector<at::Tensor> grads;
    for (const auto& schedule : kSchedules) {
      cfg.pipeline_schedule = schedule;
      cfg.data.micro_batch_size = micro;
      const auto pm_owned = build_parallel_model(cfg, mesh);
      ParallelModel& pm = *pm_owned;
      const RoundSums s = run_round(pm, mesh, cfg, inputs, targets, spec);
      const int64_t want = schedule == PipelineSchedule::Gpipe ? n_mb : std::min<int64_t>(n - stage, n_mb);
      EXPECT_EQ(s.peak_live_microbatches, want) << schedule << " stage " << stage << ", " << n_mb << " microbatches";
      EXPECT_EQ(s.tokens, mesh.is_last_stage() ? 8.0 * 16 : 0.0);
      std::vector<at::Tensor> g;
      for (auto& p : pm.params) g.push_back(p.tensor.grad().defined() ? p.tensor.grad().reshape({-1}) : at::Tensor());
      for (size_t i = 0; i < g.size(); ++i) ASSERT_TRUE(g[i].defined()) << pm.params[i].path << " has no grad";
      if (grads.empty()) {
        grads = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i)
          EXPECT_TRUE(at::allclose(g[i], grads[i], 1e-5, 1e-7)) << pm.params[i].path << " differs between schedules";
      }
      RoundSpec eval;
      eval.backward = false;
      const RoundSums e = run_round(pm, mesh, cfg, inputs, targets, eval);
      EXPECT_LE(e.peak_live_microbatches, 1);
      if (mesh.is_last_stage()) EXPECT_NEAR(sum_value(e.ce_sum), sum_value(s.ce_sum), 1e-4 * sum_value(s.ce_sum)) << "eval sees the same loss";
    }
  }
}

TEST(Pipeline, BadMicrobatchThrowsOnEveryRankWithoutHanging) {
  const int n = test_runtime().size();
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  Config cfg = base_config("pp-bad");
  cfg.data.micro_batch_size = 3;  // does not divide 8
  const auto pm_owned = build_parallel_model(cfg, mesh);
  ParallelModel& pm = *pm_owned;
  const at::Tensor tokens = at::zeros({8, 16}, at::kLong);
  EXPECT_THROW(run_round(pm, mesh, cfg, tokens, tokens, RoundSpec{}), Error);
  world->barrier();  // every rank got here: nobody waits in a send or recv
}

// A benchmark, not a pass/fail check: per-round time and the measured bubble
// (time blocked in pipeline send/recv over round time, worst stage) against
// the theory (pp - 1) / (n_mb + pp - 1). Meaningful only with a core per
// rank. ctest runs it as bench.pp_test.npN (label bench: scripts/test.sh --bench).
TEST(Pipeline, ReportsStepTimeAndBubble) {
  const int n = test_runtime().size();
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  Config cfg = base_config("pp-bench");
  cfg.model.model_dimension = 64;
  cfg.data.micro_batch_size = 2;
  const int64_t batch = 16, n_mb = batch / cfg.data.micro_batch_size, rounds = 4;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor inputs = at::randint(0, 96, {batch, 16}, gen, at::kLong);
  RoundSpec spec;
  spec.ce_scale = 1.0 / static_cast<double>(batch * 16);
  for (const auto& schedule : kSchedules) {
    cfg.pipeline_schedule = schedule;
    const test::RoundTiming tm = test::time_rounds(cfg, mesh, *world, inputs, spec, rounds);
    const double theory = static_cast<double>(n - 1) / static_cast<double>(n_mb + n - 1);
    if (world->rank() == 0)
      std::printf("[pp bench] pp %d %s: %lld microbatches, %.1f ms per round, bubble %.2f (theory %.2f)\n", n,
                  choice_name(schedule), static_cast<long long>(n_mb), 1e3 * tm.seconds,
                  tm.bubble, theory);
    EXPECT_GT(tm.seconds, 0.0);
  }
}
