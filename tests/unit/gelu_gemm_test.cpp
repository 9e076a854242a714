// GELU inside the MLP's GEMMs (ops/gelu_gemm.h, model/gelu_matmul.h) against
// plain aten math: the operators against their definition computed in fp64,
// and the autograd functions against gelu between two linears, outputs and
// every gradient, batched (the experts) or not, fp32 and bf16.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "meshtrain/model/activation.h"
#include "meshtrain/model/gelu_matmul.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/ops/gelu_gemm.h"
#include "seeded_randn.h"

namespace meshtrain {
namespace {

using test_util::randn;

at::Tensor leaf(std::vector<int64_t> shape, uint64_t seed) { return randn(std::move(shape), seed).requires_grad_(); }

void expect_close(const at::Tensor& a, const at::Tensor& b, double tol, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double err = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  const double scale = b.to(at::kDouble).abs().max().item<double>() + 1e-12;
  EXPECT_LE(err / scale, tol) << what << ": max error " << err << " (scale " << scale << ")";
}

// GELU's derivative at p (fp64, through autograd) times g.
at::Tensor dgelu(const at::Tensor& p, const at::Tensor& g) {
  at::Tensor pd = p.to(at::kDouble).detach().requires_grad_();
  at::gelu(pd, "tanh").backward(g.to(at::kDouble));
  return pd.grad();
}

TEST(GeluGemm, OperatorsMatchTheirDefinitionInFp64) {
  for (const auto dt : {at::kFloat, at::kBFloat16})
    for (const bool batched : {false, true})
      for (const bool bias : {false, true}) {
        const std::string what = std::string(dt == at::kFloat ? "fp32" : "bf16") + (batched ? " batched" : "") +
                                 (bias ? " with bias" : "");
        std::vector<int64_t> lead = batched ? std::vector<int64_t>{3} : std::vector<int64_t>{};
        auto shape = [&](std::vector<int64_t> s) {
          s.insert(s.begin(), lead.begin(), lead.end());
          return s;
        };
        const at::Tensor x = randn(shape({5, 8}), 1, dt), w = randn(shape({12, 8}), 2, dt);
        const at::Tensor b = bias ? randn(shape({12}), 3, dt) : at::Tensor();
        at::Tensor acc = at::matmul(x.to(at::kDouble), w.to(at::kDouble).transpose(-2, -1));
        if (bias) acc = acc + (batched ? b.to(at::kDouble).unsqueeze(1) : b.to(at::kDouble));
        auto [pre, h] = ops::linear_gelu(x, w, bias ? std::optional<at::Tensor>(b) : std::nullopt);
        ASSERT_EQ(pre.scalar_type(), dt) << what;
        ASSERT_EQ(h.scalar_type(), dt) << what;
        // Rounded once from the fp32 sum: within one rounding of the fp64 value.
        const double tol = dt == at::kFloat ? 1e-5 : 8e-3;
        expect_close(pre, acc, tol, what + ": pre");
        expect_close(h, at::gelu(acc, "tanh"), tol, what + ": h = gelu of the unrounded sum");

        // Backward of y = gelu(pre) w2^T: d(pre) = (dy w2) * gelu'(pre).
        const at::Tensor w2 = randn(shape({6, 12}), 4, dt), dy = randn(shape({5, 6}), 5, dt);
        const at::Tensor g = at::matmul(dy.to(at::kDouble), w2.to(at::kDouble));
        expect_close(ops::linear_dgelu(dy, w2, pre), dgelu(pre, g), dt == at::kFloat ? 1e-5 : 1.6e-2,
                     what + ": linear_dgelu");

        // Meta: shapes only.
        auto [mp, mh] = ops::linear_gelu(x.to(at::kMeta), w.to(at::kMeta),
                                         bias ? std::optional<at::Tensor>(b.to(at::kMeta)) : std::nullopt);
        EXPECT_EQ(mp.sizes(), pre.sizes()) << what;
        EXPECT_EQ(mh.sizes(), pre.sizes()) << what;
        EXPECT_EQ(ops::linear_dgelu(dy.to(at::kMeta), w2.to(at::kMeta), pre.to(at::kMeta)).sizes(), pre.sizes());
      }
}

TEST(GeluGemm, OperatorsRefuseMismatchedOperands) {
  const at::Tensor x = randn({5, 8}, 1), w = randn({12, 8}, 2);
  EXPECT_THROW(ops::linear_gelu(x, randn({12, 7}, 2), std::nullopt), std::exception);     // K differs
  EXPECT_THROW(ops::linear_gelu(x, w, randn({11}, 3)), std::exception);                   // bias length
  EXPECT_THROW(ops::linear_gelu(x, w.to(at::kBFloat16), std::nullopt), std::exception);   // dtypes differ
  EXPECT_THROW(ops::linear_gelu(randn({2, 5, 8}, 1), randn({3, 12, 8}, 2), std::nullopt), std::exception);  // E
  EXPECT_THROW(ops::linear_dgelu(randn({5, 6}, 4), randn({6, 12}, 5), randn({5, 11}, 6)), std::exception);  // H
  EXPECT_THROW(ops::linear_dgelu(randn({5, 6}, 4), randn({7, 12}, 5), randn({5, 12}, 6)), std::exception);  // N
}

// The fused pair against gelu between two linears, fp32: outputs and every
// gradient (x, both weights, the biases or the residual).
TEST(GeluGemm, FusedPairMatchesPlainCompositionWithGradients) {
  MixedPrecision mp;  // fp32
  for (const bool batched : {false, true})
    for (const bool residual : {false, true}) {
      if (batched && residual) continue;  // the experts' form has neither bias nor residual
      const std::string what = std::string(batched ? "batched" : "2-D") + (residual ? " with a residual" : "");
      const std::vector<int64_t> xs = batched ? std::vector<int64_t>{3, 7, 8} : std::vector<int64_t>{2, 3, 8};
      const at::Tensor x = leaf(xs, 1);
      const at::Tensor w1 = batched ? leaf({3, 16, 8}, 2) : leaf({16, 8}, 2);
      const at::Tensor b1 = batched ? leaf({3, 16}, 3) : leaf({16}, 3);
      const at::Tensor w2 = batched ? leaf({3, 6, 16}, 4) : leaf({6, 16}, 4);
      const at::Tensor b2 = batched || residual ? at::Tensor() : leaf({6}, 5);
      const at::Tensor res = residual ? leaf({2, 3, 6}, 6) : at::Tensor();
      const std::vector<at::Tensor> params = {x, w1, b1, w2, b2, res};
      const at::Tensor r = randn(batched ? std::vector<int64_t>{3, 7, 6} : std::vector<int64_t>{2, 3, 6}, 7);

      const auto run = [&](bool fused) {
        for (const at::Tensor& p : params)
          if (p.defined()) p.mutable_grad() = at::Tensor();
        at::Tensor y;
        if (fused) {
          y = gelu_linear(linear_gelu(x, w1, b1, mp), w2, b2, res, mp);
        } else {
          const at::Tensor pre = batched ? at::baddbmm(b1.unsqueeze(1), x, w1.transpose(1, 2)) : at::linear(x, w1, b1);
          const at::Tensor h = at::gelu(pre, "tanh");
          y = batched ? at::bmm(h, w2.transpose(1, 2)) : at::linear(h, w2, b2);
          if (residual) y = y + res;
        }
        (y * r).sum().backward();
        std::vector<at::Tensor> out = {y.detach()};
        for (const at::Tensor& p : params) out.push_back(p.defined() ? p.grad().clone() : at::Tensor());
        return out;
      };
      const auto fused = run(true), plain = run(false);
      const char* names[] = {"y", "dx", "dw1", "db1", "dw2", "db2", "dresidual"};
      for (size_t i = 0; i < fused.size(); ++i) {
        if (!plain[i].defined()) continue;
        expect_close(fused[i], plain[i], 1e-5, what + ": " + names[i]);
      }
      // Without grad mode: the forward alone, the same values.
      at::NoGradGuard no_grad;
      const GeluPre a = linear_gelu(x, w1, b1, mp);
      EXPECT_FALSE(a.pre.defined()) << what;
      expect_close(gelu_linear(a, w2, b2, res, mp), fused[0], 1e-6, what + ": no-grad forward");
    }
}

// A bf16 model: fp32 master weights, bf16 GEMMs; the gradients come out fp32
// and near those of the plain fp32 composition.
TEST(GeluGemm, Bf16PairGivesFp32GradientsNearFp32) {
  MixedPrecision bf16(PrecisionPolicy{at::kBFloat16});
  const at::Tensor x = randn({4, 5, 16}, 1), w1 = leaf({32, 16}, 2), b1 = leaf({32}, 3), w2 = leaf({16, 32}, 4);
  const at::Tensor r = randn({4, 5, 16}, 5);
  std::vector<at::Tensor> grads[2];
  at::Tensor ys[2];
  for (int i = 0; i < 2; ++i) {
    for (const at::Tensor& p : {w1, b1, w2}) p.mutable_grad() = at::Tensor();
    const at::Tensor xi = (i == 0 ? x.to(at::kBFloat16) : x).requires_grad_();
    ys[i] = i == 0 ? gelu_linear(linear_gelu(xi, w1, b1, bf16), w2, {}, {}, bf16)
                   : at::linear(at::gelu(at::linear(xi, w1, b1), "tanh"), w2);
    (ys[i].to(at::kFloat) * r).sum().backward();
    grads[i] = {xi.grad(), w1.grad(), b1.grad(), w2.grad()};
  }
  EXPECT_EQ(ys[0].scalar_type(), at::kBFloat16);
  expect_close(ys[0], ys[1], 2e-2, "bf16 y");
  const char* names[] = {"dx", "dw1", "db1", "dw2"};
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(grads[0][j].scalar_type(), j == 0 ? at::kBFloat16 : at::kFloat) << names[j];
    expect_close(grads[0][j], grads[1][j], 3e-2, std::string("bf16 ") + names[j]);
  }
}

// mlp_forward through unsharded layers: the fused path (GELU) equals the
// layers' own forwards with aten's gelu between them, residual folded or not.
TEST(GeluGemm, MlpForwardThroughLayersMatchesTheirForwards) {
  auto mp = std::make_shared<MixedPrecision>();
  PlainLinear in(leaf({16, 8}, 1), leaf({16}, 2), mp), out(leaf({8, 16}, 3), {}, mp), out_b(leaf({8, 16}, 4), leaf({8}, 5), mp);
  const at::Tensor x = leaf({2, 3, 8}, 6), res = randn({2, 3, 8}, 7);
  for (PlainLinear* o : {&out, &out_b}) {
    const at::Tensor fused = mlp_forward(MlpActivation::Gelu, in, nullptr, *o, x, res, *mp);
    fused.sum().backward();
    const at::Tensor dx = x.grad().clone(), dw = o->weight().grad().clone();
    x.mutable_grad() = at::Tensor();
    o->weight().mutable_grad() = at::Tensor();
    const at::Tensor plain = o->forward_residual(at::gelu(in.forward(x), "tanh"), res);
    plain.sum().backward();
    expect_close(fused, plain, 1e-5, "y");
    expect_close(dx, x.grad(), 1e-5, "dx");
    expect_close(dw, o->weight().grad(), 1e-5, "dw_out");
    x.mutable_grad() = at::Tensor();
    o->weight().mutable_grad() = at::Tensor();
  }
}

}  // namespace
}  // namespace meshtrain
