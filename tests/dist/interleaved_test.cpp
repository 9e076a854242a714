// The interleaved 1F1B schedule (pipeline_schedule "interleaved", Megatron's
// virtual stages): every mesh gives the losses and gradient norms of one
// process, dense and MoE + MLA, with tp, sequence parallelism and ZeRO-1;
// checkpoints move between schedules and virtual-stage counts; and the
// measured bubble against 1f1b.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/pipeline.h"
#include "meshtrain/parallel/pipeline_plan.h"
#include "parity.h"
#include "round_bench.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("interleaved-data");

Config base_config(const std::string& name) {
  Config c = test::tiny_config(test::synthetic_data(kData, 96), name);
  c.model.blocks = 4;  // 8 layers: pp 2 x v 4, pp 4 x v 2
  c.data.micro_batch_size = 1;
  return c;
}

Config interleaved(Config c, int dp, int pp, int tp, int64_t v) {
  c = test::with_mesh(c, dp, pp, tp);
  c.pipeline_schedule = PipelineSchedule::Interleaved;
  c.virtual_stages = v;
  c.name += "-" + std::to_string(dp) + std::to_string(pp) + std::to_string(tp) + "v" + std::to_string(v);
  return c;
}

void expect_parity(const Config& cfg, const test::Curve& ref, int dp, int pp, int tp, int64_t v,
                   const std::string& extra = "") {
  const Config c = interleaved(cfg, dp, pp, tp, v);
  const std::string what = "(" + std::to_string(dp) + "," + std::to_string(pp) + "," + std::to_string(tp) +
                           ") interleaved v " + std::to_string(v) + extra;
  test::expect_same_curve(ref, test::train_losses(c), 1e-5, what);
}

}  // namespace

TEST(Interleaved, DenseMatchesOneProcess) {
  const int n = test_runtime().size();
  Config cfg = base_config("il-dense");
  const auto ref = test::single_process_losses(cfg);
  if (n == 2) {
    expect_parity(cfg, ref, 1, 2, 1, 2);
    expect_parity(cfg, ref, 1, 2, 1, 4);  // one layer per chunk
  }
  if (n == 4) {
    expect_parity(cfg, ref, 1, 4, 1, 2);
    expect_parity(cfg, ref, 2, 2, 1, 2);  // 4 microbatches per dp rank
    Config sp = cfg;
    sp.sequence_parallel = true;
    expect_parity(sp, ref, 1, 2, 2, 2, " sequence parallel");
  }
  if (n == 8) {
    Config z = cfg;
    z.sequence_parallel = true;
    z.zero_stage = 1;
    expect_parity(z, ref, 2, 2, 2, 2, " sequence parallel, ZeRO-1");
  }
}

TEST(Interleaved, MoeMlaMatchesOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::moe_mla(base_config("il-moe-mla"));
  cfg.model.blocks = 2;  // 4 layers: one per chunk at pp 2, v 2
  // Each chunk adds its own layers' aux loss to its backward, and its expert
  // counts land on its own layers.
  const auto ref = test::single_process_losses(cfg);
  expect_parity(cfg, ref, n / 2, 2, 1, 2);
  if (n == 8) {
    Config z = cfg;
    z.zero_stage = 1;
    expect_parity(z, ref, 2, 2, 2, 2, " ZeRO-1");
  }
}

TEST(Interleaved, MisconfigurationThrowsOnEveryRank) {
  const int n = test_runtime().size();
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  Config cfg = base_config("il-bad");
  cfg.model.blocks = 8;  // 16 layers: n * 2 chunks at np 2, 4, 8
  cfg.pipeline_schedule = PipelineSchedule::Interleaved;
  cfg.virtual_stages = 3;  // 16 layers do not split into n * 3 chunks
  EXPECT_THROW(build_parallel_model(cfg, mesh), Error);
  cfg.virtual_stages = 2;
  cfg.data.micro_batch_size = 8;  // one microbatch: not a multiple of pp
  const auto pm_owned = build_parallel_model(cfg, mesh);
  ParallelModel& pm = *pm_owned;
  const at::Tensor tokens = at::zeros({8, 16}, at::kLong);
  EXPECT_THROW(run_round(pm, mesh, cfg, tokens, tokens, RoundSpec{}), Error);
  world->barrier();  // every rank got here: nobody waits in a send or recv
}

// Saved under the interleaved schedule with v = 2, a checkpoint continues
// under 1f1b, under v = 4 and without a pipeline as one process would: the
// checkpoint names layers by their global index, whatever rank held them.
TEST(Interleaved, CheckpointsMoveBetweenSchedules) {
  const int n = test_runtime().size();
  if (n != 2) GTEST_SKIP() << "runs on 2 ranks (the np 2 job)";
  auto world = test_runtime().world();
  Config c = base_config("il-ckpt");
  c.checkpoint_steps = 4;
  c.training_steps = 8;
  const auto ref = test::single_process_losses(c);
  Config first = interleaved(c, 1, 2, 1, 2);
  first.training_steps = 4;
  test::run_losses(first, true);
  world->barrier();
  const std::string saved = first.run_dir();
  struct Next {
    PipelineSchedule schedule;
    int64_t v;
    int dp, pp;
  };
  for (const Next& next : {Next{PipelineSchedule::OneFOneB, 1, 1, 2}, Next{PipelineSchedule::Interleaved, 4, 1, 2},
                           Next{PipelineSchedule::OneFOneB, 1, 2, 1}}) {
    Config second = test::with_mesh(c, next.dp, next.pp, 1);
    second.pipeline_schedule = next.schedule;
    second.virtual_stages = next.v;
    second.name = first.name + "-then-" + choice_name(next.schedule) + std::to_string(next.v) + "-dp" + std::to_string(next.dp);
    test::expect_continues(saved, second, ref, 4);
  }
}

// A benchmark, not a pass/fail check of the numbers: the measured bubble
// (time blocked in pipeline send/recv over round time, worst stage) of 1f1b
// and interleaved v = 2 and 4 against (pp - 1) / (v * n_mb + pp - 1).
// Meaningful only with a core per rank. ctest runs it as
// bench.interleaved_test.npN (label bench: scripts/test.sh --bench).
TEST(Interleaved, ReportsBubbleAgainst1f1b) {
  const int n = test_runtime().size();
  if (n > 4) GTEST_SKIP() << "reports at np 2 and 4 (8 layers have no v > 1 at pp 8)";
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, n, 1});
  Config cfg = base_config("il-bench");
  cfg.model.model_dimension = 64;
  cfg.data.micro_batch_size = 2;
  const int64_t batch = 4 * n * cfg.data.micro_batch_size, n_mb = 4 * n, rounds = 3;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor inputs = at::randint(0, 96, {batch, 16}, gen, at::kLong);
  RoundSpec spec;
  spec.ce_scale = 1.0 / static_cast<double>(batch * 16);
  for (int64_t v : {1, 2, 4}) {
    if (8 % (n * v) != 0) continue;  // 8 layers
    cfg.pipeline_schedule = v == 1 ? PipelineSchedule::OneFOneB : PipelineSchedule::Interleaved;
    cfg.virtual_stages = v;
    const test::RoundTiming tm = test::time_rounds(cfg, mesh, *world, inputs, spec, rounds);
    if (world->rank() == 0)
      std::printf("[interleaved bench] pp %d v %lld %s: %lld microbatches, %.1f ms per round, bubble %.3f "
                  "(theory %.3f)\n",
                  n, static_cast<long long>(v), choice_name(cfg.pipeline_schedule), static_cast<long long>(n_mb),
                  1e3 * tm.seconds, tm.bubble, pipeline_bubble_fraction(n, n_mb, v));
    EXPECT_GT(tm.seconds, 0.0);
  }
}
