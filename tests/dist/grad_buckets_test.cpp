// Gradient reduction overlapped with backward (overlap_grad_reduce,
// parallel/grad_buckets.h): on every mesh the gradients after the step's
// synchronisation and the global gradient norms equal those of the reduction
// after backward (overlap_grad_reduce false) within 1e-6, dense and MoE, with
// gradient accumulation and microbatches, under tp (sequence parallel) and pp
// (1f1b, interleaved). Small buckets make several per stage, so most are
// launched from the hooks while backward runs. Runs under mpirun -np 2 and 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/parallel/grad_buckets.h"
#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("grad-buckets-data");

// Per step: every parameter's gradient after train_step (reduced, before
// clipping) and the global norm.
struct Run {
  std::vector<std::vector<at::Tensor>> grads;
  std::vector<double> norms, losses;
  int64_t buckets = 0, launched_in_backward = 0;
  int64_t bucketed = 0, in_buckets = 0;  // the last step's covered parameters, gradients that are bucket views
};

Run run(Config cfg, bool overlap) {
  cfg.overlap_grad_reduce = overlap;
  cfg.name += overlap ? "-on" : "-off";
  SessionOptions o;
  o.fresh = true;
  o.quiet = true;
  // The hooks fire on the thread running backward: with overlap, on one of
  // its own, as on CUDA (the off run keeps the forward's thread).
  o.backward_thread = overlap;
  Trainer t(cfg, test_runtime(), o);
  EXPECT_EQ(t.model().data_parallel->buckets() != nullptr, overlap && cfg.device.dp() > 1 && cfg.device.expert_parallel == 1)
      << cfg.name;
  Run r;
  for (int64_t step = 0; step < cfg.training_steps; ++step) {
    StepStats s = t.train_step();
    if (t.model().data_parallel->buckets()) {
      r.bucketed = t.model().data_parallel->buckets()->bucketed_params();
      r.in_buckets = t.model().data_parallel->buckets()->grads_in_buckets();
    }
    std::vector<at::Tensor> g;
    for (const ParamInfo& p : t.model().params)
      g.push_back(p.tensor.grad().defined() ? p.tensor.grad().detach().clone() : at::Tensor());
    r.grads.push_back(std::move(g));
    t.apply_update(s, 1e-3);
    s.read();
    r.norms.push_back(s.grad_norm);
    r.losses.push_back(s.loss);
    if (t.model().data_parallel->buckets()) {
      r.buckets = t.model().data_parallel->buckets()->num_buckets();
      r.launched_in_backward = std::max(r.launched_in_backward, t.model().data_parallel->buckets()->launched_in_backward());
    }
  }
  return r;
}

void expect_same(const Run& off, const Run& on, const std::string& what) {
  ASSERT_EQ(off.grads.size(), on.grads.size()) << what;
  for (size_t s = 0; s < off.grads.size(); ++s) {
    EXPECT_NEAR(off.losses[s], on.losses[s], 1e-6) << what << ": loss of step " << s;
    EXPECT_NEAR(off.norms[s], on.norms[s], 1e-6 * std::max(1.0, off.norms[s])) << what << ": grad norm of step " << s;
    ASSERT_EQ(off.grads[s].size(), on.grads[s].size()) << what;
    for (size_t i = 0; i < off.grads[s].size(); ++i) {
      const at::Tensor &a = off.grads[s][i], &b = on.grads[s][i];
      ASSERT_EQ(a.defined(), b.defined()) << what << ": parameter " << i << " of step " << s;
      if (!a.defined()) continue;
      const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6) << what << ": gradient of parameter " << i << " at step " << s;
    }
  }
}

// Two 8-row accumulation rounds of 2-row microbatches (per dp rank) and
// buckets of ~4 KiB: a layer of the tiny model spans several.
Config base(const std::string& name, int dp, int pp, int tp) {
  Config c = test::with_mesh(test::tiny_config(test::synthetic_data(kData, 96), name), dp, pp, tp);
  c.grad_step = 2;
  c.data.micro_batch_size = std::max(1, 8 / dp / 2);
  c.training_steps = 3;
  c.grad_bucket_mb = 4.0 / 1024;
  return c;
}

void compare(const Config& cfg) {
  const Run off = run(cfg, false), on = run(cfg, true);
  expect_same(off, on, cfg.name);
  if (cfg.device.dp() > 1 && cfg.device.expert_parallel == 1) {
    EXPECT_GT(on.buckets, 1) << cfg.name;
    // The point of it: buckets go out while backward still runs.
    EXPECT_GT(on.launched_in_backward, 0) << cfg.name;
    // Every covered gradient is a view of its bucket: reduced in place, no cat and copy back.
    EXPECT_GT(on.bucketed, 0) << cfg.name;
    EXPECT_EQ(on.in_buckets, on.bucketed) << cfg.name;
  }
}

}  // namespace

TEST(GradBuckets, DenseSameGradientsAsAfterBackward) {
  compare(base("gb-dense", test_runtime().size(), 1, 1));
}

TEST(GradBuckets, MoeSameGradientsAsAfterBackward) {
  Config c = test::moe_mla(base("gb-moe", test_runtime().size(), 1, 1));
  c.model.capacity_factor = 1.0;  // some tokens dropped
  compare(c);
}

// Dropless MoE runs its experts one by one on counts: an expert that got no
// token on one rank has no gradient there (a hook that never fires).
TEST(GradBuckets, DroplessMoeSameGradientsAsAfterBackward) {
  Config c = test::moe_mla(base("gb-dropless", test_runtime().size(), 1, 1));
  c.model.capacity_factor = 0;
  compare(c);
}

// Expert parallelism keeps the reduction after backward (see make_optimizer):
// no buckets, the same gradients.
TEST(GradBuckets, ExpertParallelKeepsTheReductionAfterBackward) {
  Config c = test::moe_mla(base("gb-ep", test_runtime().size(), 1, 1));
  c.device.expert_parallel = 2;
  compare(c);
}

TEST(GradBuckets, TensorParallelSequenceParallelSame) {
  const int n = test_runtime().size();
  if (n < 4) GTEST_SKIP() << "needs 4 ranks for dp 2 x tp 2";
  Config c = base("gb-tp", 2, 1, 2);
  c.sequence_parallel = true;
  compare(c);
}

TEST(GradBuckets, PipelineSame) {
  const int n = test_runtime().size();
  if (n < 4) GTEST_SKIP() << "needs 4 ranks for dp 2 x pp 2";
  compare(base("gb-1f1b", 2, 2, 1));
  Config c = base("gb-interleaved", 2, 2, 1);
  c.pipeline_schedule = PipelineSchedule::Interleaved;
  c.virtual_stages = 2;
  c.model.tie_embeddings = true;  // the tied copies are summed over pp after backward
  compare(c);
}

// Overlap on, every mesh against one process: losses and norms as before.
TEST(GradBuckets, MatchesOneProcess) {
  Config c = base("gb-ref", test_runtime().size(), 1, 1);
  c.training_steps = 4;
  const auto ref = test::single_process_losses(c);
  test::expect_same_curve(ref, test::train_losses(c, /*backward_thread=*/true), 1e-5, "overlap on vs one process");
}
