// The zero-bubble schedules (pipeline_schedule "zb-h1" and "zbv"): each
// backward split into B (input gradients) and W (the queued weight-gradient
// GEMMs), run as the plans of parallel/pipeline_plan.h say. Every mesh gives
// the losses and gradient norms of one process, dense and MoE + MLA, with
// dp buckets, tp + sequence parallelism, ZeRO-1, FSDP, ep, cp,
// recomputation and bf16; dropout draws 1f1b's masks; checkpoints move
// between 1f1b, the zero-bubble schedules and one process; sampling through the V's
// pipeline draws one process's tokens; and the measured bubble against 1f1b.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "meshtrain/core/check.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/parallel/pipeline.h"
#include "meshtrain/parallel/pipeline_generate.h"
#include "meshtrain/parallel/pipeline_plan.h"
#include "meshtrain/sampling/generate.h"
#include "meshtrain/train/evaluate.h"
#include "generate_parity.h"
#include "parity.h"
#include "round_bench.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("zero-bubble-data");
const PipelineSchedule kSchedules[] = {PipelineSchedule::ZbH1, PipelineSchedule::Zbv};

Config base_config(const std::string& name) {
  Config c = test::tiny_config(test::synthetic_data(kData, 96), name);
  c.model.blocks = 4;  // 8 layers: the V's 2pp chunks at pp 2 and 4
  c.data.micro_batch_size = 1;
  return c;
}

Config zero_bubble(Config c, PipelineSchedule s, int dp, int pp, int tp) {
  c = test::with_mesh(c, dp, pp, tp);
  c.pipeline_schedule = s;
  c.name += "-" + std::string(choice_name(s)) + "-" + std::to_string(dp) + std::to_string(pp) + std::to_string(tp);
  return c;
}

// Whether pipeline_pass_costs changes some stage's zbv plan (else a parity
// run with them would prove nothing new).
bool costs_change_the_v(const Config& cfg, int pp) {
  const int64_t n_mb = cfg.data.train_batch_size / cfg.data.micro_batch_size;
  Config equal = cfg;
  equal.pipeline_pass_costs.clear();
  for (int s = 0; s < pp; ++s) {
    const auto a = pipeline_plan(PipelineSchedule::Zbv, s, pp, n_mb, true, 2, pipeline_pass_costs(cfg));
    const auto b = pipeline_plan(PipelineSchedule::Zbv, s, pp, n_mb, true, 2, pipeline_pass_costs(equal));
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i].step != b[i].step || a[i].microbatch != b[i].microbatch || a[i].chunk != b[i].chunk) return true;
  }
  return false;
}

void expect_parity(const Config& cfg, const test::Curve& ref, int dp, int pp, int tp, const std::string& extra = "",
                   double tol = 1e-5) {
  for (PipelineSchedule s : kSchedules) {
    const std::string what = "(" + std::to_string(dp) + "," + std::to_string(pp) + "," + std::to_string(tp) + ") " +
                             choice_name(s) + extra;
    test::expect_same_curve(ref, test::train_losses(zero_bubble(cfg, s, dp, pp, tp)), tol, what);
  }
}

}  // namespace

TEST(ZeroBubble, DenseMatchesOneProcess) {
  const int n = test_runtime().size();
  const Config cfg = base_config("zb-dense");
  const auto ref = test::single_process_losses(cfg);
  if (n == 2) {
    expect_parity(cfg, ref, 1, 2, 1);
    Config mb2 = cfg;
    mb2.data.micro_batch_size = 4;  // 2 microbatches: fewer than the V's warm-up
    expect_parity(mb2, test::single_process_losses(mb2), 1, 2, 1, " 2 microbatches");
    // Plans made with the passes' measured lengths order the passes
    // differently, never the numbers.
    Config costs = cfg;
    costs.pipeline_pass_costs = {1, 1, 0.7};
    ASSERT_TRUE(costs_change_the_v(costs, 2));
    expect_parity(costs, ref, 1, 2, 1, " pipeline_pass_costs [1, 1, 0.7]");
  }
  if (n == 4) {
    expect_parity(cfg, ref, 1, 4, 1);
    Config costs = cfg;
    costs.pipeline_pass_costs = {1, 2, 0.5};
    ASSERT_TRUE(costs_change_the_v(costs, 4));
    expect_parity(costs, ref, 1, 4, 1, " pipeline_pass_costs [1, 2, 0.5]");
    expect_parity(cfg, ref, 2, 2, 1, " (dp buckets)");
    Config sp = cfg;
    sp.sequence_parallel = true;
    expect_parity(sp, ref, 1, 2, 2, " sequence parallel");
  }
  if (n == 8) {
    Config z = cfg;
    z.sequence_parallel = true;
    z.zero_stage = 1;
    expect_parity(z, ref, 2, 2, 2, " sequence parallel, ZeRO-1");
  }
}

// FSDP reduce-scatters a layer after the W that completes its gradients
// (the B pass only releases its gathered weights), expert parallelism's
// all-to-alls stay in B, and context parallelism's ring is B's too.
TEST(ZeroBubble, FsdpExpertAndContextParallelMatchOneProcess) {
  if (test_runtime().size() != 4) GTEST_SKIP() << "dp 2 x pp 2 and cp 2 x pp 2 need -np 4";
  const Config dense = base_config("zb-mesh4");
  const auto ref = test::single_process_losses(dense);
  for (int zero : {2, 3}) {
    Config z = dense;
    z.zero_stage = zero;
    expect_parity(z, ref, 2, 2, 1, " zero_stage " + std::to_string(zero));
  }
  Config cp = dense;
  cp.device.context_parallel = 2;
  expect_parity(cp, ref, 1, 2, 1, " cp 2");
  Config moe = test::moe_mla(base_config("zb-ep2"));
  moe.model.blocks = 2;
  moe.device.expert_parallel = 2;
  const auto moe_ref = test::single_process_losses(moe);
  expect_parity(moe, moe_ref, 2, 2, 1, " ep 2");
  moe.zero_stage = 3;
  expect_parity(moe, moe_ref, 2, 2, 1, " ep 2, zero_stage 3");
}

// Dropout draws its masks in the forwards, which zb-h1 runs in 1f1b's order
// on every stage: the same masks, the same run.
TEST(ZeroBubble, DropoutDrawsOneFOneBsMasks) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "runs at -np 2";
  Config c = base_config("zb-dropout");
  c.model.dropout_rate = 0.2;
  Config one = test::with_mesh(c, 1, 2, 1);
  one.name += "-1f1b";
  const auto ref = test::train_losses(one);
  const auto got = test::train_losses(zero_bubble(c, PipelineSchedule::ZbH1, 1, 2, 1));
  test::expect_same_curve(ref, got, 1e-5, "zb-h1 with dropout against 1f1b");
  c.model.dropout_rate = 0;
  EXPECT_GT(std::abs(test::train_losses(zero_bubble(c, PipelineSchedule::ZbH1, 1, 2, 1)).back() - got.back()), 1e-4)
      << "dropout changes nothing: the comparison above proves nothing";
}

// The deferred GEMMs of a recomputed layer are those of its recomputation:
// W still finds their operands after B freed the layer's saved tensors.
TEST(ZeroBubble, RecomputationMatchesOneProcess) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "runs at -np 2";
  for (ActivationCheckpointing ac : {ActivationCheckpointing::Selective, ActivationCheckpointing::Full}) {
    Config cfg = base_config(std::string("zb-ac-") + choice_name(ac));
    cfg.activation_checkpointing = ac;
    expect_parity(cfg, test::single_process_losses(cfg), 1, 2, 1, std::string(" recompute ") + choice_name(ac));
  }
}

// CUDA's autograd engine runs each backward on its device thread: B queues
// its products (and FSDP its reduce-scatters) from there, W runs them on the
// main thread (SessionOptions::backward_thread, as bf16_test does).
TEST(ZeroBubble, BackwardOnItsOwnThreadMatchesOneProcess) {
  if (test_runtime().size() != 4) GTEST_SKIP() << "dp 2 x pp 2 needs -np 4";
  Config cfg = base_config("zb-thread");
  cfg.zero_stage = 3;
  const auto ref = test::single_process_losses(cfg, true);
  for (PipelineSchedule s : kSchedules)
    test::expect_same_curve(ref, test::train_losses(zero_bubble(cfg, s, 2, 2, 1), true), 1e-5,
                            std::string(choice_name(s)) + " zero_stage 3, backward thread");
}

TEST(ZeroBubble, MoeMlaMatchesOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::moe_mla(base_config("zb-moe-mla"));
  cfg.model.blocks = 2;  // 4 layers: one per chunk of the V at pp 2
  // The experts' batched GEMMs queue their weight gradients too; each chunk
  // adds its own layers' aux loss in B.
  const auto ref = test::single_process_losses(cfg);
  expect_parity(cfg, ref, n / 2, 2, 1);
  if (n == 8) {
    Config z = cfg;
    z.zero_stage = 1;
    expect_parity(z, ref, 2, 2, 2, " ZeRO-1");
  }
}

// bf16: the mesh accumulates its microbatches' weight gradients in fp32 (the
// W pass adds into the fp32 gradient) where one bf16 process may not, so the
// two agree to bf16's rounding (bf16_test.cpp's 2^-7 bound), not exactly.
TEST(ZeroBubble, Bf16WithinRoundingOfOneProcess) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "runs at -np 2";
  Config cfg = base_config("zb-bf16");
  cfg.model.model_dtype = ModelDtype::Bfloat16;
  const auto ref = test::single_process_losses(cfg);
  for (PipelineSchedule s : kSchedules) {
    const auto got = test::train_losses(zero_bubble(cfg, s, 1, 2, 1));
    ASSERT_EQ(ref.size(), got.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(ref[i], got[i], 0.0078 * ref[i]) << choice_name(s) << " loss of step " << i + 1;
      EXPECT_NEAR(ref.grad_norms[i], got.grad_norms[i], 0.0078 * ref.grad_norms[i])
          << choice_name(s) << " grad norm of step " << i + 1;
    }
  }
}

// Saved under zbv (the V places layers 0-1 and 6-7 on stage 0 at pp 2), a
// checkpoint continues under 1f1b, under zb-h1 and as one process: the
// checkpoint names layers by their global index, whatever rank held them.
TEST(ZeroBubble, CheckpointsMoveBetweenSchedules) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "runs on 2 ranks (the np 2 job)";
  auto world = test_runtime().world();
  Config c = base_config("zb-ckpt");
  c.checkpoint_steps = 4;
  c.training_steps = 8;
  const auto ref = test::single_process_losses(c);
  Config first = zero_bubble(c, PipelineSchedule::Zbv, 1, 2, 1);
  first.training_steps = 4;
  test::run_losses(first, true);
  world->barrier();
  const std::string saved = first.run_dir();
  struct Next {
    PipelineSchedule schedule;
    int dp, pp;
  };
  for (const Next& next : {Next{PipelineSchedule::OneFOneB, 1, 2}, Next{PipelineSchedule::ZbH1, 1, 2},
                           Next{PipelineSchedule::OneFOneB, 2, 1}}) {
    Config second = test::with_mesh(c, next.dp, next.pp, 1);
    second.pipeline_schedule = next.schedule;
    second.name = first.name + "-then-" + choice_name(next.schedule) + "-dp" + std::to_string(next.dp);
    test::expect_continues(saved, second, ref, 4);
  }
}

// Saved under 1f1b, a checkpoint continues under zb-h1 and zbv.
TEST(ZeroBubble, ResumesFromAOneFOneBCheckpoint) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "runs on 2 ranks (the np 2 job)";
  auto world = test_runtime().world();
  Config c = base_config("zb-from-1f1b");
  c.checkpoint_steps = 4;
  c.training_steps = 8;
  const auto ref = test::single_process_losses(c);
  Config first = test::with_mesh(c, 1, 2, 1);
  first.training_steps = 4;
  test::run_losses(first, true);
  world->barrier();
  for (PipelineSchedule s : kSchedules) {
    Config second = zero_bubble(c, s, 1, 2, 1);
    test::expect_continues(first.run_dir(), second, ref, 4);
  }
}

// Evaluation runs the schedules' forward-only plans (the V's too): the
// validation loss of one process.
TEST(ZeroBubble, EvaluationMatchesOneProcess) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "runs at -np 2";
  Config c = base_config("zb-eval");
  c.eval_steps = 2;
  const auto validation = [](Config cfg, const Communicator* world) {
    SessionOptions o;
    o.fresh = o.quiet = true;
    Trainer t(cfg, test_runtime(), o, world);
    t.train();
    return evaluate(t.session()).loss;
  };
  Config one = c;
  one.device.n_device_axis = {1, 1, 1};
  one.name += "-one-rank" + std::to_string(test_runtime().rank());
  auto world = test_runtime().world();
  auto self = split_communicator(*world, world->rank(), 0);
  const double ref = validation(one, self.get());
  for (PipelineSchedule s : kSchedules)
    EXPECT_NEAR(validation(zero_bubble(c, s, 1, 2, 1), nullptr), ref, 1e-5) << choice_name(s);
}

// Sampling walks the V (stage 0, 1, 1, 0 at pp 2) and the head on stage 0
// shares each token: the tokens of one process.
TEST(ZeroBubble, PipelineGenerateUnderTheVMatchesOneProcess) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "pp 2 needs -np 2";
  Config c = base_config("zb-generate");
  c.data.micro_batch_size = 2;
  const SampleOptions so = test::sample_options();
  const test::Samples& prompts = test::kPrompts;
  const test::Samples one = test::one_process_samples(c, prompts, so);
  const test::Samples piped = test::pipeline_samples(zero_bubble(c, PipelineSchedule::Zbv, 1, 2, 1), prompts, so);
  EXPECT_EQ(one, piped);
}

// The executor holds what the plan says (plan_peak_live: forward done, W
// not yet), the number plan's memory model multiplies by a microbatch's
// activations; every gradient is there after the round.
TEST(ZeroBubble, InFlightMicrobatchesAreThePlans) {
  const int n = test_runtime().size();
  if (n > 4) GTEST_SKIP() << "8 layers have no V at pp 8";
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  Config cfg = base_config("zb-inflight");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor inputs = at::randint(0, 96, {8, 16}, gen, at::kLong);
  RoundSpec spec;
  spec.ce_scale = 1.0 / (8 * 16);
  for (PipelineSchedule s : kSchedules) {
    cfg.pipeline_schedule = s;
    const auto pm_owned = build_parallel_model(cfg, mesh);
    const RoundSums sums = run_round(*pm_owned, mesh, cfg, inputs, inputs, spec);
    const int64_t v = s == PipelineSchedule::Zbv ? 2 : 1;
    EXPECT_EQ(sums.peak_live_microbatches, plan_peak_live(pipeline_plan(s, mesh.coord().pp, n, 8, true, v)))
        << choice_name(s) << " stage " << mesh.coord().pp;
    for (const auto& p : pm_owned->params)
      EXPECT_TRUE(!p.tensor.requires_grad() || p.tensor.grad().defined()) << choice_name(s) << ": " << p.path;
  }
}

// The split plans time their forward, B and W passes (what metrics.jsonl's
// pipeline_pass_costs reports); 1F1B's rounds carry no pass clocks.
TEST(ZeroBubble, SplitPlansTimeTheirPasses) {
  const int n = test_runtime().size();
  if (n > 4) GTEST_SKIP() << "pp 2 and 4 suffice";
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  Config cfg = base_config("zb-passes");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor inputs = at::randint(0, 96, {2 * n, 16}, gen, at::kLong);
  RoundSpec spec;
  spec.ce_scale = 1.0 / static_cast<double>(2 * n * 16);
  for (PipelineSchedule s : {PipelineSchedule::OneFOneB, PipelineSchedule::ZbH1, PipelineSchedule::Zbv}) {
    cfg.pipeline_schedule = s;
    const auto pm = build_parallel_model(cfg, mesh);
    const RoundSums sums = run_round(*pm, mesh, cfg, inputs, inputs, spec);
    const std::array<double, 3> p = sums.pass_seconds();
    if (s == PipelineSchedule::OneFOneB) {
      EXPECT_TRUE(sums.passes.empty());
      continue;
    }
    ASSERT_EQ(sums.passes.size(), 1u) << choice_name(s);
    for (size_t i = 0; i < 3; ++i) EXPECT_GT(p[i], 0.0) << choice_name(s) << " pass " << i;
    EXPECT_LT(p[0] + p[1] + p[2], 60.0) << choice_name(s);
  }
  world->barrier();
}

TEST(ZeroBubble, MisconfigurationThrowsOnEveryRank) {
  const int n = test_runtime().size();
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  Config cfg = base_config("zb-bad");
  cfg.model.blocks = 3;  // 6 layers: no V of 2 * n chunks at np 2, 4, 8
  cfg.pipeline_schedule = PipelineSchedule::Zbv;
  EXPECT_THROW(build_parallel_model(cfg, mesh), Error);
  world->barrier();  // every rank got here: nobody waits in a send or recv
}

// A benchmark, not a pass/fail check of the numbers: the measured bubble
// (time blocked in pipeline send/recv over round time, worst stage) of 1f1b,
// interleaved (v 2), zb-h1 and zbv at 2 microbatches per stage, beside each
// plan's idle fraction on the timeline it was made on. Meaningful only with
// a core per rank. ctest runs it as bench.zero_bubble_test.npN (label
// bench: scripts/test.sh --bench).
TEST(ZeroBubble, ReportsBubbleAgainst1f1b) {
  const int n = test_runtime().size();
  if (n > 4) GTEST_SKIP() << "reports at np 2 and 4 (8 layers have no V at pp 8)";
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  Config cfg = base_config("zb-bench");
  cfg.model.model_dimension = 256;  // compute, not per-op overhead, fills the round
  cfg.data.micro_batch_size = 2;
  const int64_t n_mb = 2 * n, batch = n_mb * cfg.data.micro_batch_size, rounds = 9;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor inputs = at::randint(0, 96, {batch, 16}, gen, at::kLong);
  RoundSpec spec;
  spec.ce_scale = 1.0 / static_cast<double>(batch * 16);
  // The "W 0.7" rows: the zero-bubble plans made with a W 0.7 of a B (what
  // a W measures here, timed per pass), timed on that timeline too.
  const std::vector<std::pair<PipelineSchedule, std::vector<double>>> rows = {
      {PipelineSchedule::OneFOneB, {}}, {PipelineSchedule::Interleaved, {}}, {PipelineSchedule::ZbH1, {}},
      {PipelineSchedule::ZbH1, {1, 1, 0.7}}, {PipelineSchedule::Zbv, {}},   {PipelineSchedule::Zbv, {1, 1, 0.7}}};
  for (const auto& [s, costs] : rows) {
    cfg.pipeline_schedule = s;
    cfg.pipeline_pass_costs = costs;
    cfg.virtual_stages = s == PipelineSchedule::Interleaved ? 2 : 1;
    const int64_t v = s == PipelineSchedule::Interleaved || s == PipelineSchedule::Zbv ? 2 : 1;
    const PassCosts timeline = pipeline_pass_costs(cfg);  // what the run's plans are made with
    std::vector<std::vector<PipeOp>> plans;
    for (int st = 0; st < n; ++st) plans.push_back(pipeline_plan(s, st, n, n_mb, true, v, timeline));
    const double plan_idle = time_plans(plans, v, s == PipelineSchedule::Zbv, timeline).idle_fraction;
    const test::RoundTiming tm = test::time_rounds(cfg, mesh, *world, inputs, spec, rounds);
    char lengths[64] = "";
    if (tm.passes[0] > 0)
      std::snprintf(lengths, sizeof lengths, "; forward : B : W = 1 : %.2f : %.2f", tm.passes[1] / tm.passes[0],
                    tm.passes[2] / tm.passes[0]);
    if (world->rank() == 0)
      std::printf("[zero-bubble bench] pp %d %-11s%s: %lld microbatches, %.1f ms per round, bubble %.3f "
                  "(the plan's %.3f)%s\n",
                  n, choice_name(s), costs.empty() ? "" : " W 0.7", static_cast<long long>(n_mb), 1e3 * tm.seconds,
                  tm.bubble, plan_idle, lengths);
    EXPECT_GT(tm.seconds, 0.0);
  }
}
