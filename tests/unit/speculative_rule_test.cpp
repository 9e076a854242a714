// Speculative sampling's acceptance rule (sampling/speculative_rule.h) on
// hand-made distributions over 6 tokens: the first token of 200,000 verdicts
// follows p (not q), a chain of 2 drafts gives the first two tokens the joint
// p1(x1) p2(x2 | x1), one-hot distributions keep drafts exactly while they
// equal p's argmax and draw nothing, and bad input is refused.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "chi_square.h"
#include "meshtrain/core/check.h"
#include "meshtrain/sampling/speculative_rule.h"

namespace meshtrain {
namespace {

at::Tensor dist(std::vector<double> w) {
  const at::Tensor t = at::tensor(w, at::kDouble);
  return (t / t.sum()).to(at::kFloat);
}

// p and q unlike each other, with a token p never draws that q proposes (5)
// and one q never proposes that p draws (0).
at::Tensor p1() { return dist({0.05, 0.30, 0.10, 0.25, 0.30, 0.0}); }
at::Tensor q1() { return dist({0.0, 0.05, 0.25, 0.10, 0.30, 0.30}); }

// The second position's distributions, one row per first token: different
// fixed patterns for p and q.
at::Tensor p2() {
  std::vector<at::Tensor> rows;
  for (int64_t a = 0; a < 6; ++a) {
    std::vector<double> w;
    for (int64_t b = 0; b < 6; ++b) w.push_back(static_cast<double>(1 + (a * 3 + b * 5) % 7));
    rows.push_back(dist(w));
  }
  return at::stack(rows);
}
at::Tensor q2() {
  std::vector<at::Tensor> rows;
  for (int64_t a = 0; a < 6; ++a) {
    std::vector<double> w;
    for (int64_t b = 0; b < 6; ++b) w.push_back(static_cast<double>((a + 2 * b) % 5));
    rows.push_back(dist(w));
  }
  return at::stack(rows);
}

std::vector<double> as_vector(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous().view({-1});
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

constexpr int64_t kDraws = 200000;

TEST(SpeculativeRule, FirstTokenFollowsPNotQ) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor p = at::stack({p1(), dist({1, 1, 1, 1, 1, 1})}), q = q1().view({1, -1});
  std::vector<int64_t> counts(6, 0), accepted(2, 0);
  for (int64_t i = 0; i < kDraws; ++i) {
    const int64_t d = draw(q[0], gen);
    const DraftVerdict v = verify_drafts(p, q, {d}, gen);
    ++counts[static_cast<size_t>(v.accepted == 1 ? d : v.next)];
    ++accepted[static_cast<size_t>(v.accepted)];
  }
  const test::ChiSquare c = test::chi_square(as_vector(p1()), counts);
  EXPECT_TRUE(c.fits()) << c.str();
  EXPECT_EQ(counts[5], 0) << "p never draws token 5";
  // Kept with probability sum_x min(p(x), q(x)) (1 - their total variation):
  // within 5 binomial standard deviations.
  const double kept = at::minimum(p1(), q1()).sum().item<double>();
  const double rate = static_cast<double>(accepted[1]) / static_cast<double>(kDraws);
  EXPECT_NEAR(rate, kept, 5 * std::sqrt(kept * (1 - kept) / static_cast<double>(kDraws))) << rate;
  std::printf("first token: %s; acceptance %.4f (expected %.4f)\n", c.str().c_str(), rate, kept);
}

TEST(SpeculativeRule, TwoDraftChainGivesTheJointOfP) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor P1 = p1(), Q1 = q1(), P2 = p2(), Q2 = q2(), P3 = dist({1, 2, 3, 4, 5, 6});
  std::vector<int64_t> counts(36, 0), accepted(3, 0);
  for (int64_t i = 0; i < kDraws; ++i) {
    const int64_t d1 = draw(Q1, gen), d2 = draw(Q2[d1], gen);
    const DraftVerdict v = verify_drafts(at::stack({P1, P2[d1], P3}), at::stack({Q1, Q2[d1]}), {d1, d2}, gen);
    int64_t x1 = d1, x2 = d2;
    if (v.accepted == 0) {
      x1 = v.next;
      x2 = draw(P2[x1], gen);  // the next round's token, drawn from p as plain sampling does
    } else if (v.accepted == 1) {
      x2 = v.next;
    }
    ++counts[static_cast<size_t>(x1 * 6 + x2)];
    ++accepted[static_cast<size_t>(v.accepted)];
  }
  const std::vector<double> joint = as_vector(P1.unsqueeze(1) * P2);
  const test::ChiSquare c = test::chi_square(joint, counts);
  EXPECT_TRUE(c.fits()) << c.str();
  // Every outcome of the chain happened (the test reaches each branch).
  for (int64_t a = 0; a < 3; ++a) EXPECT_GT(accepted[static_cast<size_t>(a)], kDraws / 20) << a << " drafts kept";
  std::printf("first two tokens: %s; 0/1/2 drafts kept %lld/%lld/%lld\n", c.str().c_str(),
              static_cast<long long>(accepted[0]), static_cast<long long>(accepted[1]),
              static_cast<long long>(accepted[2]));
}

TEST(SpeculativeRule, OneHotKeepsDraftsWhileTheyEqualTheArgmaxAndDrawsNothing) {
  const auto one_hot = [](int64_t i) { return at::one_hot(at::tensor(i), 6).view({6}).to(at::kFloat); };
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor p = at::stack({one_hot(2), one_hot(4), one_hot(1)});
  DraftVerdict v = verify_drafts(p, at::stack({one_hot(2), one_hot(3)}), {2, 3}, gen);
  EXPECT_EQ(v.accepted, 1);
  EXPECT_EQ(v.next, 4);
  v = verify_drafts(p, at::stack({one_hot(2), one_hot(4)}), {2, 4}, gen);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 1);
  v = verify_drafts(p, at::stack({one_hot(0), one_hot(4)}), {0, 4}, gen);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 2);
  // The verdicts drew nothing from the generator but the one draw per token
  // (a one-hot's draw is certain): its stream is where a fresh one's is
  // after the same number of draws.
  at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int i = 0; i < 3; ++i) draw(one_hot(0), fresh);
  EXPECT_EQ(gen.get<at::CPUGeneratorImpl>()->random64(), fresh.get<at::CPUGeneratorImpl>()->random64());
}

TEST(SpeculativeRule, BadInputIsRefused) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor p = at::stack({p1(), p1()}), q = q1().view({1, -1});
  EXPECT_THROW(verify_drafts(p, q, {0}, gen), Error);          // q(0) = 0: not drawn from q
  EXPECT_THROW(verify_drafts(p, q, {6}, gen), Error);          // outside the vocabulary
  EXPECT_THROW(verify_drafts(p, q, {1, 2}, gen), Error);       // more drafts than rows
  EXPECT_THROW(verify_drafts(p1(), q, {1}, gen), Error);       // p not [n + 1, V]
  EXPECT_THROW(draw(at::zeros({4}), gen), Error);              // nothing to draw
  for (int i = 0; i < 1000; ++i) EXPECT_NE(draw(p1(), gen), 5);  // weight 0: never drawn
}

}  // namespace
}  // namespace meshtrain
