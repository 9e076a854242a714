// meshtrain::adamw_ (ops/adamw.h): the CPU kernel against aten's fused AdamW
// (fp32 moments) and against fp32 math on the bf16 state (the aten composite:
// aten's update on widened copies of the moments, rounded back), found_inf
// and grad_scale as aten has them, gradients left alone, the weights' bf16
// casts written in the same pass, the meta kernel and the argument checks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/ops/adamw.h"
#include "ops/adamw_math.h"
#include "ops/kernels.h"

namespace meshtrain {
namespace {

struct State {
  std::vector<at::Tensor> p, g, m, v;
};

// Sizes around the CPU kernel's work split (32768 elements a task): one, a
// few, and several tasks.
State make(at::ScalarType moments, uint64_t seed, const at::Device& device = at::kCPU) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  State s;
  for (int64_t n : {1, 7, 1000, 70001}) {
    s.p.push_back(at::randn({n}, gen, f32));
    s.g.push_back(at::randn({n}, gen, f32) * 0.1);
    s.m.push_back((at::randn({n}, gen, f32) * 0.01).to(moments));
    s.v.push_back((at::randn({n}, gen, f32).abs() * 1e-3).to(moments));
  }
  if (device.is_meta())
    for (auto* l : {&s.p, &s.g, &s.m, &s.v})
      for (auto& t : *l) t = at::empty_like(t, t.options().device(at::kMeta));
  return s;
}

State clone(const State& s) {
  State c;
  for (const auto& t : s.p) c.p.push_back(t.clone());
  for (const auto& t : s.g) c.g.push_back(t.clone());
  for (const auto& t : s.m) c.m.push_back(t.clone());
  for (const auto& t : s.v) c.v.push_back(t.clone());
  return c;
}

at::Tensor scalar(float x) { return at::full({}, x, at::TensorOptions().dtype(at::kFloat)); }

const ops::AdamwHyper kHyper{1e-3, 0.9, 0.95, 0.1, 1e-8};

// aten's fused AdamW; on copies of the gradients (it writes the unscaled
// ones back, which the next step would divide again).
void aten_adamw(State& s, const at::Tensor& step, const at::Tensor& scale = {}, const at::Tensor& inf = {}) {
  const std::vector<at::Tensor> steps(s.p.size(), step);
  std::vector<at::Tensor> g;
  for (const auto& t : s.g) g.push_back(t.clone());
  std::optional<at::Tensor> sc, fi;
  if (scale.defined()) sc = scale;
  if (inf.defined()) fi = inf;
  at::_fused_adamw_(s.p, g, s.m, s.v, {}, steps, kHyper.lr, kHyper.beta1, kHyper.beta2, kHyper.weight_decay,
                    kHyper.eps, false, false, sc, fi);
}

// Largest |a - b| / (|b| + floor) over a list.
double max_rel(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double floor) {
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    const at::Tensor x = a[k].to(at::kDouble), y = b[k].to(at::kDouble);
    worst = std::max(worst, ((x - y).abs() / (y.abs() + floor)).max().item<double>());
  }
  return worst;
}

TEST(AdamwOp, Fp32MomentsMatchAtenFusedAdamw) {
  for (bool scaled : {false, true}) {
    State ours = make(at::kFloat, 1), ref = clone(ours);
    const at::Tensor scale = scaled ? scalar(2.5f) : at::Tensor();
    for (int t = 1; t <= 3; ++t) {
      ops::adamw_(ours.p, ours.g, ours.m, ours.v, scalar(static_cast<float>(t)), kHyper, scale);
      aten_adamw(ref, scalar(static_cast<float>(t)), scale);
    }
    SCOPED_TRACE(scaled ? "grad_scale 2.5" : "no grad_scale");
    // Same formula, fp32 either way: round-off only, relative to the size of
    // the terms summed (a step moves p by ~1e-3; m sums terms ~1e-2 that
    // may cancel, aten as a lerp; v terms ~1e-3).
    EXPECT_LT(max_rel(ours.p, ref.p, 1.0), 1e-6);
    EXPECT_LT(max_rel(ours.m, ref.m, 1e-2), 1e-5);
    EXPECT_LT(max_rel(ours.v, ref.v, 1e-4), 1e-5);
  }
}

TEST(AdamwOp, Bf16MomentsAreFp32MathRoundedOnce) {
  State ours = make(at::kBFloat16, 2), ref = clone(ours);
  const State before = clone(ours);
  const at::Tensor scale = scalar(1.7f);
  for (int t = 1; t <= 3; ++t) {
    const at::Tensor step = scalar(static_cast<float>(t));
    ops::adamw_(ours.p, ours.g, ours.m, ours.v, step, kHyper, scale);
    ops::impl::adamw_ref(ref.p, ref.g, ref.m, ref.v, step, kHyper.lr, kHyper.beta1, kHyper.beta2, kHyper.weight_decay,
                    kHyper.eps, scale, std::nullopt, std::nullopt, {});
    for (size_t k = 0; k < ours.m.size(); ++k) {
      ASSERT_EQ(ours.m[k].scalar_type(), at::kBFloat16);
      ASSERT_EQ(ours.v[k].scalar_type(), at::kBFloat16);
    }
  }
  // The moments: rounded from fp32 values that agree to round-off, so equal
  // but where a value sits on a rounding boundary (then one bf16 step apart).
  int64_t differ = 0, total = 0;
  for (size_t k = 0; k < ours.m.size(); ++k)
    for (const auto& [a, b] : {std::pair{ours.m[k], ref.m[k]}, std::pair{ours.v[k], ref.v[k]}}) {
      differ += a.ne(b).sum().item<int64_t>();
      total += a.numel();
    }
  EXPECT_LE(differ, total / 1000) << differ << " of " << total << " moments differ";
  EXPECT_LT(max_rel(ours.m, ref.m, 1e-4), 1.0 / 128);
  EXPECT_LT(max_rel(ours.v, ref.v, 1e-6), 1.0 / 128);
  // The weights: round-off apart, but where an earlier step's moment was
  // rounded one bf16 step apart (2^-8 of it): then by that share of a step.
  int64_t moved = 0, weights = 0;
  for (size_t k = 0; k < ours.p.size(); ++k) {
    const at::Tensor d = (ours.p[k] - ref.p[k]).abs();
    EXPECT_LE(d.max().item<double>(), 3 * kHyper.lr / 128) << "tensor " << k;
    moved += d.gt(1e-6 * (ref.p[k].abs() + 1)).sum().item<int64_t>();
    weights += d.numel();
  }
  EXPECT_LE(moved, weights / 200) << moved << " of " << weights << " weights differ beyond round-off";
  // The moments really are bf16-limited: not what fp32 moments give.
  State wide = clone(before);
  for (auto& t : wide.m) t = t.to(at::kFloat);
  for (auto& t : wide.v) t = t.to(at::kFloat);
  for (int t = 1; t <= 3; ++t) aten_adamw(wide, scalar(static_cast<float>(t)), scale);
  EXPECT_GT(max_rel(ours.v, wide.v, 1e-9), 1e-4);
  // Gradients are read, never written (aten writes the unscaled ones back).
  for (size_t k = 0; k < ours.g.size(); ++k) EXPECT_TRUE(at::equal(ours.g[k], before.g[k])) << k;
}

TEST(AdamwOp, FoundInfSkipsTheWholeUpdate) {
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    State s = make(dt, 3);
    const State before = clone(s);
    ops::adamw_(s.p, s.g, s.m, s.v, scalar(1), kHyper, {}, scalar(1));
    for (size_t k = 0; k < s.p.size(); ++k) {
      EXPECT_TRUE(at::equal(s.p[k], before.p[k]));
      EXPECT_TRUE(at::equal(s.m[k], before.m[k]));
      EXPECT_TRUE(at::equal(s.v[k], before.v[k]));
    }
    ops::adamw_(s.p, s.g, s.m, s.v, scalar(1), kHyper, {}, scalar(0));
    EXPECT_FALSE(at::equal(s.p.back(), before.p.back()));
  }
}

// The casts a bf16 model reads next (model/mixed_precision.h's kept casts)
// are the updated weights rounded as Tensor::to rounds them, bit for bit,
// for both moment dtypes; a skipped update leaves them, and every update
// bumps the weights' version counters (what tells a kept cast it is stale).
TEST(AdamwOp, CastsAreTheUpdatedWeightsAsToRoundsThem) {
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(dt == at::kFloat ? "fp32 moments" : "bf16 moments");
    State s = make(dt, 6), plain = clone(s);
    std::vector<at::Tensor> casts;
    for (const auto& p : s.p) casts.push_back(at::full(p.sizes(), 7.0, p.options().dtype(at::kBFloat16)));
    const int64_t v0 = s.p[0]._version();
    const at::Tensor scale = scalar(1.3f);
    ops::adamw_(s.p, s.g, s.m, s.v, scalar(1), kHyper, scale, {}, casts);
    ops::adamw_(plain.p, plain.g, plain.m, plain.v, scalar(1), kHyper, scale);
    EXPECT_GT(s.p[0]._version(), v0);
    for (size_t k = 0; k < s.p.size(); ++k) {
      EXPECT_TRUE(at::equal(s.p[k], plain.p[k])) << "the update itself is the same, tensor " << k;
      EXPECT_TRUE(at::equal(casts[k], s.p[k].to(at::kBFloat16))) << "tensor " << k;
    }
    const std::vector<at::Tensor> before = {casts[0].clone(), casts[3].clone()};
    ops::adamw_(s.p, s.g, s.m, s.v, scalar(2), kHyper, {}, scalar(1), casts);
    EXPECT_TRUE(at::equal(casts[0], before[0]) && at::equal(casts[3], before[1])) << "skipped update wrote casts";
    // Wrong casts are refused by name.
    std::vector<at::Tensor> wrong = casts;
    wrong[2] = wrong[2].to(at::kHalf);
    EXPECT_THROW(ops::adamw_(s.p, s.g, s.m, s.v, scalar(2), kHyper, {}, {}, wrong), Error);
    wrong.pop_back();
    EXPECT_THROW(ops::adamw_(s.p, s.g, s.m, s.v, scalar(2), kHyper, {}, {}, wrong), Error);
  }
}

TEST(AdamwOp, MetaKernelChecksShapesAndRunsNothing) {
  State s = make(at::kBFloat16, 4, at::kMeta);
  const auto meta_scalar = at::empty({}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  ops::adamw_(s.p, s.g, s.m, s.v, meta_scalar, kHyper, meta_scalar, meta_scalar);
  s.v[1] = at::empty({8}, s.v[1].options());
  EXPECT_THROW(ops::adamw_(s.p, s.g, s.m, s.v, meta_scalar, kHyper), Error);
}

TEST(AdamwOp, RefusesMixedMomentsAndNonFp32Weights) {
  State s = make(at::kBFloat16, 5);
  State mixed = clone(s);
  mixed.v[2] = mixed.v[2].to(at::kFloat);
  EXPECT_THROW(ops::adamw_(mixed.p, mixed.g, mixed.m, mixed.v, scalar(1), kHyper), Error);
  State half = clone(s);
  half.m[0] = half.m[0].to(at::kHalf);
  half.v[0] = half.v[0].to(at::kHalf);
  EXPECT_THROW(ops::adamw_(half.p, half.g, half.m, half.v, scalar(1), kHyper), Error);
  State bf16_weights = clone(s);
  bf16_weights.p[1] = bf16_weights.p[1].to(at::kBFloat16);
  EXPECT_THROW(ops::adamw_(bf16_weights.p, bf16_weights.g, bf16_weights.m, bf16_weights.v, scalar(1), kHyper), Error);
}

// The CUDA launches (planned on the host, ops/adamw_math.h) cover every
// chunk of every tensor once, within a launch's table: more tensors than one
// table holds, a tensor of more chunks than one launch's blocks (carried
// over), empty tensors, a table filling up exactly at a tensor's end.
TEST(AdamwOp, CudaLaunchPlanCoversEveryChunkOnce) {
  using namespace ops::adamw;
  std::vector<int64_t> n;
  for (int64_t k = 0; k < 40; ++k) n.push_back(1 + 997 * k);
  n.push_back(0);
  n.push_back(kChunk * 323 + 5);
  // Launch 1: 36 one-chunk tensors (the table's tensors); launch 2: 4 more
  // and 316 chunks of the 324; launch 3: its last 8 and this one's 312, to
  // the last block exactly; launch 4: the 3-element tensor.
  n.push_back(kChunk * (kBlocks - 8));
  n.push_back(0);
  n.push_back(3);
  std::vector<std::vector<int>> seen(n.size());
  for (size_t k = 0; k < n.size(); ++k) seen[k].assign(static_cast<size_t>((n[k] + kChunk - 1) / kChunk), 0);
  int launches = 0;
  int64_t last = -1;
  plan_launches(static_cast<int64_t>(n.size()), n.data(), [&](const LaunchPlan& p) {
    ++launches;
    ASSERT_GT(p.blocks, 0);
    ASSERT_LE(p.blocks, kBlocks);
    ASSERT_GT(p.tensors, 0);
    ASSERT_LE(p.tensors, kTensors);
    for (int b = 0; b < p.blocks; ++b) {
      ASSERT_LT(p.tensor_of[b], p.tensors);
      const int64_t k = p.tensor[p.tensor_of[b]];
      ASSERT_GE(k, last) << "tensors in order";
      last = k;
      ASSERT_GE(p.chunk_of[b], 0);
      ASSERT_LT(static_cast<size_t>(p.chunk_of[b]), seen[static_cast<size_t>(k)].size());
      ++seen[static_cast<size_t>(k)][static_cast<size_t>(p.chunk_of[b])];
    }
  });
  for (size_t k = 0; k < n.size(); ++k)
    for (size_t c = 0; c < seen[k].size(); ++c) EXPECT_EQ(seen[k][c], 1) << "tensor " << k << " chunk " << c;
  EXPECT_EQ(launches, 4);
}

}  // namespace
}  // namespace meshtrain
