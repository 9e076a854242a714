// optimizer_state_dtype "bfloat16": AdamW's moments kept in bf16 (fp32 math,
// ops/adamw.h) train the same on zero_stage 0, 1, 2 and 3 as one process does
// (the update is element-wise, rounding to nearest: no dependence on the
// sharding), hold half the optimizer bytes, resume bit-exactly from their
// checkpoints, and checkpoints move between the two state dtypes (converted
// on load). The default fp32 moments are the other tests' business.
#include <gtest/gtest.h>

#include <filesystem>

#include "meshtrain/optim/adamw.h"
#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("optimizer-state-data");

Config config(const std::string& name, int stage, ModelDtype state) {
  const int n = test_runtime().size();
  Config c = test::tiny_config(test::synthetic_data(kData, 96), name + "-np" + std::to_string(n));
  c = test::with_mesh(c, n, 1, 1);
  c.grad_clip_norm = 0.5;  // clipping on: grad_scale reaches the bf16 update
  c.zero_stage = stage;
  c.optimizer_state_dtype = state;
  c.name += "-zero" + std::to_string(stage) + (state == ModelDtype::Bfloat16 ? "-bf16" : "-fp32");
  return c;
}

SessionOptions fresh_run() {
  SessionOptions o;
  o.fresh = true;
  o.quiet = true;
  return o;
}

// Trains `steps` steps saving at step `save_at`, from scratch.
test::Curve train_and_save(Config c, int64_t steps, int64_t save_at) {
  c.training_steps = steps;
  c.checkpoint_steps = save_at;
  // A previous run of this test left later checkpoints here.
  if (test_runtime().rank() == 0) std::filesystem::remove_all(c.run_dir());
  test_runtime().world()->barrier();
  Trainer t(c, test_runtime(), fresh_run());
  t.train();
  return test::curve_of(t);
}

// Resumes c's run directory from its latest checkpoint up to `steps`.
test::Curve resume(const Config& c, int64_t steps, int64_t expect_from, ModelDtype* moments = nullptr) {
  Config b = c;
  b.training_steps = steps;
  SessionOptions o;
  o.quiet = true;
  Trainer t(b, test_runtime(), o);
  EXPECT_EQ(t.step(), expect_from);
  t.train();
  if (moments) {
    ResidentBytes r = t.data_parallel().resident_bytes();
    *moments = r.optimizer == t.data_parallel().state_numel() * 2 ? ModelDtype::Bfloat16 : ModelDtype::Float32;
  }
  return test::curve_of(t);
}

}  // namespace

TEST(OptimizerState, Bf16MomentsTrainAlikeOnZeroStages0123) {
  const auto ref = test::single_process_losses(config("stages", 0, ModelDtype::Bfloat16));
  for (int stage : {0, 1, 2, 3}) {
    const Config c = config("stages", stage, ModelDtype::Bfloat16);
    SCOPED_TRACE("zero_stage " + std::to_string(stage));
    Trainer t(c, test_runtime(), fresh_run());
    t.train();
    test::expect_same_curve(ref, test::curve_of(t), 1e-5, "bf16 moments");
    // Half the bytes of fp32 moments for as many elements.
    const int64_t numel = t.data_parallel().state_numel(), bytes = t.data_parallel().resident_bytes().optimizer;
    EXPECT_GT(numel, 0);
    EXPECT_EQ(bytes, 2 * numel);
  }
  // The key changes the run (the moments are rounded), not by much.
  const auto fp32 = test::single_process_losses(config("stages", 0, ModelDtype::Float32));
  ASSERT_EQ(fp32.size(), ref.size());
  double diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) diff = std::max(diff, std::abs(fp32[i] - ref[i]));
  std::printf("largest loss difference, fp32 vs bf16 moments over %zu steps: %.3g\n", ref.size(), diff);
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 0.05);
}

TEST(OptimizerState, Bf16MomentsResumeBitExactly) {
  for (int stage : {0, 1, 3}) {
    SCOPED_TRACE("zero_stage " + std::to_string(stage));
    const Config c = config("resume", stage, ModelDtype::Bfloat16);
    const auto straight = train_and_save(c, 6, 3);  // saves at 3 and 6
    // Back to step 3: drop the later checkpoint.
    const auto again = train_and_save(c, 3, 3);
    ASSERT_EQ(again.size(), 3u);
    ModelDtype kept = ModelDtype::Float32;
    const auto resumed = resume(c, 6, 3, &kept);
    EXPECT_EQ(kept, ModelDtype::Bfloat16);
    ASSERT_EQ(resumed.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(straight[3 + i], resumed[i]) << "loss of step " << 3 + i;
      EXPECT_EQ(straight.grad_norms[3 + i], resumed.grad_norms[i]) << "grad norm of step " << 3 + i;
    }
  }
}

// A checkpoint of either state dtype resumes under the other: the moments are
// converted as they load (bf16 -> fp32 exactly, fp32 -> bf16 rounded), and
// the run goes on close to the one that never switched.
TEST(OptimizerState, ResumeUnderTheOtherStateDtypeConverts) {
  for (ModelDtype saved : {ModelDtype::Float32, ModelDtype::Bfloat16}) {
    const ModelDtype now = saved == ModelDtype::Float32 ? ModelDtype::Bfloat16 : ModelDtype::Float32;
    const Config c = config("switch", 1, saved);
    SCOPED_TRACE(std::string("saved with ") + (saved == ModelDtype::Float32 ? "fp32" : "bf16") + " moments");
    const auto straight = train_and_save(c, 6, 6);
    train_and_save(c, 3, 3);
    Config b = c;
    b.optimizer_state_dtype = now;
    ModelDtype kept = saved;
    const auto resumed = resume(b, 6, 3, &kept);
    EXPECT_EQ(kept, now);
    ASSERT_EQ(resumed.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(straight[3 + i], resumed[i], 0.02) << "loss of step " << 3 + i;
  }
}

// A bf16 model at zero_stage 0 keeps the weights' casts the optimizer writes
// (optimizer_writes_casts): a resumed run casts its loaded weights afresh and
// must continue bit for bit as the run that never stopped, whose casts came
// out of the update (fp32 and bf16 moments).
TEST(OptimizerState, Bf16ModelWithWrittenCastsResumesBitExactly) {
  for (ModelDtype moments : {ModelDtype::Float32, ModelDtype::Bfloat16}) {
    SCOPED_TRACE(moments == ModelDtype::Float32 ? "fp32 moments" : "bf16 moments");
    Config c = config("resume-casts", 0, moments);
    c.model.model_dtype = ModelDtype::Bfloat16;
    ASSERT_TRUE(c.optimizer_writes_casts);
    const auto straight = train_and_save(c, 6, 3);
    const auto again = train_and_save(c, 3, 3);
    ASSERT_EQ(again.size(), 3u);
    const auto resumed = resume(c, 6, 3);
    ASSERT_EQ(resumed.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(straight[3 + i], resumed[i]) << "loss of step " << 3 + i;
      EXPECT_EQ(straight.grad_norms[3 + i], resumed.grad_norms[i]) << "grad norm of step " << 3 + i;
    }
  }
}

