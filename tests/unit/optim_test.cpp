#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/schedule.h"

using namespace meshtrain;

TEST(Schedule, KnownSteps) {
  LrConfig lr;
  lr.min_lr = 0.0;
  lr.max_lr = 6e-4;
  lr.end_lr = 6e-5;
  lr.warmup_steps = 10;
  lr.end_steps = 110;
  EXPECT_DOUBLE_EQ(learning_rate(lr, 0), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(lr, 5), 3e-4);
  EXPECT_DOUBLE_EQ(learning_rate(lr, 10), 6e-4);
  // Half-way through the cosine: the mean of max and end.
  EXPECT_NEAR(learning_rate(lr, 60), 0.5 * (6e-4 + 6e-5), 1e-12);
  EXPECT_NEAR(learning_rate(lr, 110), 6e-5, 1e-12);
  EXPECT_NEAR(learning_rate(lr, 5000), 6e-5, 1e-12);
  // Monotone decay after warmup.
  for (int s = 11; s < 110; ++s) EXPECT_LE(learning_rate(lr, s), learning_rate(lr, s - 1));
}

TEST(Schedule, NoWarmup) {
  LrConfig lr;
  lr.max_lr = 1.0;
  lr.end_lr = 0.0;
  lr.warmup_steps = 0;
  lr.end_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate(lr, 0), 1.0);
  EXPECT_NEAR(learning_rate(lr, 2), 0.5, 1e-12);
}

TEST(AdamW, MatchesClosedForm) {
  LrConfig cfg;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.weight_decay = 0.1;
  at::Tensor w = torch::tensor({1.0f, -2.0f, 3.0f}).requires_grad_(true);
  at::Tensor n = torch::tensor({0.5f}).requires_grad_(true);
  AdamW opt({{"w", w, true, {}, {}}, {"norm", n, false, {}, {}}}, cfg);
  const float g1[3] = {0.1f, -0.2f, 0.3f}, g2[3] = {-0.3f, 0.1f, 0.2f};
  const double lr = 0.01;
  double ref[3] = {1, -2, 3}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
  for (int t = 1; t <= 2; ++t) {
    const float* g = t == 1 ? g1 : g2;
    w.mutable_grad() = torch::tensor({g[0], g[1], g[2]});
    n.mutable_grad() = torch::tensor({1.0f});
    opt.step(lr);
    for (int i = 0; i < 3; ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.95, t));
      ref[i] -= lr * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * ref[i]);
    }
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[i].item<double>(), ref[i], 1e-6) << i;
  // No decay on the norm weight: two steps of a constant unit gradient move it by
  // exactly 2 * lr (Adam's normalised step is 1 for a constant gradient).
  EXPECT_NEAR(n.item<double>(), 0.5 - 2 * lr, 1e-6);
  EXPECT_EQ(opt.steps_taken(), 2);
}

TEST(AdamW, SkipsParamsWithoutGrad) {
  LrConfig cfg;
  at::Tensor w = torch::ones({2}).requires_grad_(true);
  AdamW opt({{"w", w, true, {}, {}}}, cfg);
  opt.step(0.1);
  EXPECT_TRUE(torch::equal(w, torch::ones({2})));
}

// optimizer_state_dtype bfloat16: the moments are bf16 and the update is the
// closed form to bf16's precision of the moments; a step skipped by found_inf
// changes nothing and does not count.
TEST(AdamW, Bf16MomentsFollowTheClosedForm) {
  LrConfig cfg;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.weight_decay = 0.1;
  at::Tensor w = torch::tensor({1.0f, -2.0f, 3.0f}).requires_grad_(true);
  AdamW opt({{"w", w, true, {}, {}}}, cfg, at::kBFloat16);
  ASSERT_EQ(opt.params()[0].exp_avg.scalar_type(), at::kBFloat16);
  ASSERT_EQ(opt.params()[0].exp_avg_sq.scalar_type(), at::kBFloat16);
  const float g1[3] = {0.1f, -0.2f, 0.3f}, g2[3] = {-0.3f, 0.1f, 0.2f};
  const double lr = 0.01;
  double ref[3] = {1, -2, 3}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
  for (int t = 1; t <= 2; ++t) {
    const float* g = t == 1 ? g1 : g2;
    w.mutable_grad() = torch::tensor({g[0], g[1], g[2]});
    opt.step(lr);
    for (int i = 0; i < 3; ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.95, t));
      ref[i] -= lr * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * ref[i]);
    }
  }
  // Step 2 reads moments rounded to bf16 (2^-9 relative): a share of a step.
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[i].item<double>(), ref[i], lr * 1e-2) << i;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(opt.params()[0].exp_avg[i].item<double>(), m[i], std::abs(m[i]) / 128) << i;
  const at::Tensor before = w.detach().clone();
  w.mutable_grad() = torch::tensor({1.0f, 1.0f, 1.0f});
  opt.step(lr, torch::ones({}));  // found_inf
  EXPECT_TRUE(torch::equal(w.detach(), before));
  EXPECT_EQ(opt.steps_taken(), 2);
}
