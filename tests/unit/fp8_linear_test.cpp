// FP8 linear layers (model/fp8_linear.h): each recipe's three GEMMs against
// a reference written from the definition (quantize each operand's scale
// groups -> dequantize -> multiply in fp64), the experts' batched and
// grouped forms, the weight-gradient queue of zero-bubble schedules, the
// casts shared within a round, and training: FP8 is really in use (losses
// differ from bf16), stays close to bf16 and the loss falls.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/model/fp8_linear.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/model/transformer.h"
#include "tiny_model.h"

using namespace meshtrain;

namespace {

constexpr Fp8Recipe kRecipes[] = {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise, Fp8Recipe::Blockwise};

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, scale, shape, gen, at::TensorOptions().dtype(at::kFloat));
}

// The definition: t [R, C] cut into tr x tc tiles (the last ones partial);
// per tile amax = max |t|, s = fmax / amax in fp32, q = the format's value
// nearest t s (clamped to +-fmax), and the value q (1 / s).
at::Tensor definition(const at::Tensor& t, at::ScalarType dtype, int64_t tr, int64_t tc) {
  const at::Tensor f = t.to(at::kFloat);
  const int64_t R = f.size(0), C = f.size(1);
  tr = std::min(tr, R);
  tc = std::min(tc, C);
  const float fmax = dtype == at::kFloat8_e4m3fn ? 448.0f : 57344.0f;
  at::Tensor out = at::empty({R, C}, at::kDouble);
  for (int64_t r = 0; r < R; r += tr)
    for (int64_t c = 0; c < C; c += tc) {
      const at::Tensor tile = f.narrow(0, r, std::min(tr, R - r)).narrow(1, c, std::min(tc, C - c));
      const float amax = std::max(tile.abs().max().item<float>(), 1e-12f);
      const float s = fmax / amax;
      const at::Tensor q = (tile * s).clamp(-fmax, fmax).to(dtype).to(at::kDouble);
      out.narrow(0, r, tile.size(0)).narrow(1, c, tile.size(1)).copy_(q * static_cast<double>(1.0f / s));
    }
  return out;
}

// A recipe's operand [R, C] (C the GEMM's reduction) by the definition.
at::Tensor operand(const at::Tensor& t, Fp8Operand op) {
  const int64_t R = t.size(0), C = t.size(1);
  switch (op.granularity) {
    case ops::Fp8Granularity::kTensor: return definition(t, op.dtype, R, C);
    case ops::Fp8Granularity::kRow: return definition(t, op.dtype, 1, C);
    case ops::Fp8Granularity::kTile: return definition(t, op.dtype, 1, 128);
    case ops::Fp8Granularity::kBlock: return definition(t, op.dtype, 128, 128);
  }
  return {};
}

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// |got - want| <= tol * max |want|, elementwise; returns the worst ratio.
double expect_close(const at::Tensor& got, const at::Tensor& want, double tol, const std::string& what) {
  const double err = max_abs(got.to(at::kDouble) - want) / max_abs(want);
  EXPECT_LE(err, tol) << what;
  return err;
}

std::shared_ptr<MixedPrecision> precision(Fp8Recipe r) {
  return std::make_shared<MixedPrecision>(PrecisionPolicy::from_model_dtype(ModelDtype::Bfloat16, r));
}

at::Tensor param(std::vector<int64_t> shape, uint64_t seed, double scale) {
  return randn(std::move(shape), seed, scale).requires_grad_(true);
}

}  // namespace

// y = x W^T, dx = dy W and dW = dy^T x, each from its two operands
// quantized by the definition. The outputs are bf16 (y, dx: one rounding
// of the fp32 sum, 2^-8) and fp32 (dW: the fp32 sum's round-off); FP8 is in
// use: y is off the unquantized product by far more than bf16.
TEST(Fp8Linear, ForwardAndBothGradientsAreTheDefinition) {
  // M 70 tokens, K 300 (two whole 128-tiles and a partial one), N 200.
  const at::Tensor x = randn({70, 300}, 1).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor dy = randn({70, 200}, 2, 1e-3).to(at::kBFloat16);
  for (Fp8Recipe r : kRecipes) {
    SCOPED_TRACE(choice_name(r));
    auto mp = precision(r);
    const at::Tensor w = param({200, 300}, 3, 0.05);
    mp->mark_fp8(w, std::make_shared<Fp8Split>());
    x.mutable_grad() = at::Tensor();
    const at::Tensor y = mp->fused_linear(x, w);
    y.backward(dy);
    ASSERT_EQ(y.scalar_type(), at::kBFloat16);
    ASSERT_EQ(w.grad().scalar_type(), at::kFloat);
    const Fp8Plan p = Fp8Plan::of(r);
    const at::Tensor wc = w.detach().to(at::kBFloat16);  // quantized from its bf16 cast
    const at::Tensor y_ref = at::mm(operand(x.detach(), p.x), operand(wc, p.w).t());
    const at::Tensor dx_ref = at::mm(operand(dy, p.dy), operand(wc.t(), p.w).t());
    const at::Tensor dw_ref = at::mm(operand(dy.t(), p.dy), operand(x.detach().t(), p.x).t());
    const double ey = expect_close(y, y_ref, std::ldexp(1.0, -8), "y");
    const double ex = expect_close(x.grad(), dx_ref, std::ldexp(1.0, -8), "dx");
    const double ew = expect_close(w.grad(), dw_ref, 1e-5, "dW");
    const at::Tensor plain = at::mm(x.detach().to(at::kDouble), wc.to(at::kDouble).t());
    const double q = max_abs(y.to(at::kDouble) - plain) / max_abs(plain);
    EXPECT_GT(q, std::ldexp(1.0, -7)) << "y is the bf16 product: FP8 not in use";
    EXPECT_LT(q, std::ldexp(1.0, -2));
    std::printf("%-10s y %.2e dx %.2e dW %.2e from the definition; y vs unquantized %.3f\n", choice_name(r), ey, ex,
                ew, q);
  }
}

// Fused projections (q, k, v) stay one GEMM per weight, each weight its
// own scales; biases and a residual are added to the bf16 products (one
// more bf16 rounding); their gradients are mixed_linear's.
TEST(Fp8Linear, FusedWeightsBiasesAndResidual) {
  const at::Tensor x = randn({2, 9, 64}, 4).to(at::kBFloat16);
  for (Fp8Recipe r : kRecipes) {
    SCOPED_TRACE(choice_name(r));
    auto mp = precision(r);
    auto split = std::make_shared<Fp8Split>();
    const at::Tensor w1 = param({48, 64}, 5, 0.05), w2 = param({16, 64}, 6, 5.0);  // scales 100x apart
    const at::Tensor b1 = param({48}, 7, 0.1), b2 = param({16}, 8, 0.1);
    mp->mark_fp8(w1, split);
    mp->mark_fp8(w2, split);
    const at::Tensor fused = mp->fused_linear(x, {w1, w2}, {b1, b2});
    const at::Tensor one = mp->fused_linear(x, w1), two = mp->fused_linear(x, w2);
    const at::Tensor bias = at::cat({b1, b2}).to(at::kBFloat16).to(at::kFloat);
    const at::Tensor apart = (at::cat({one, two}, -1).to(at::kFloat) + bias);
    // The bf16 sum against the fp32 one: a bf16 ulp of each weight's largest apart at most.
    for (const auto& [from, n] : {std::pair<int64_t, int64_t>{0, 48}, {48, 16}}) {
      const at::Tensor a = apart.narrow(-1, from, n), f = fused.to(at::kFloat).narrow(-1, from, n);
      EXPECT_LE(max_abs(f - a) / max_abs(a), std::ldexp(1.0, -7)) << "columns from " << from;
    }
    fused.sum().backward();
    EXPECT_TRUE(at::allclose(b1.grad(), at::full({48}, 18.0)));
    EXPECT_TRUE(w2.grad().defined() && w1.grad().defined());
    const at::Tensor res = randn({2, 9, 48}, 9).to(at::kBFloat16).requires_grad_(true);
    const at::Tensor with_res = mp->fused_linear(x, w1, {}, res);
    const at::Tensor sum = one.to(at::kFloat) + res.to(at::kFloat);
    EXPECT_LE(max_abs(with_res.to(at::kFloat) - sum) / max_abs(sum), std::ldexp(1.0, -7));
    with_res.sum().backward();
    EXPECT_TRUE(at::equal(res.grad(), at::ones_like(res)));
  }
}

// The experts' batched GEMM with segments: each sender's block of an
// expert's rows is the operand one process has for that microbatch, so the
// result is each block's own GEMM (bitwise), and the weight gradient the
// sum of the blocks' in fp32. The grouped (dropless) form is the same
// arithmetic emulated over dequantized operands: equal to fp32 round-off.
TEST(Fp8Linear, ExpertBlocksAreEachTheirOwnOperand) {
  const int64_t E = 2, S = 5, K = 40, N = 24;
  const at::Tensor x = randn({E, 2 * S, K}, 10).to(at::kBFloat16);
  // The second sender's rows 1000x the first's: one scale for both would lose them.
  const at::Tensor xs = x * at::cat({at::ones({1, S, 1}), at::full({1, S, 1}, 1000.0)}, 1).to(at::kBFloat16);
  const at::Tensor dy = randn({E, 2 * S, N}, 11).to(at::kBFloat16);
  for (Fp8Recipe r : kRecipes) {
    SCOPED_TRACE(choice_name(r));
    auto mp = precision(r);
    const at::Tensor w = param({E, N, K}, 12, 0.1);
    mp->mark_fp8(w, std::make_shared<Fp8Split>());
    const at::Tensor in = xs.clone().requires_grad_(true);
    const at::Tensor y = batched_linear(in, w, *mp, 2);
    y.backward(dy);
    const at::Tensor dw = w.grad().clone(), dx = in.grad().clone();
    at::Tensor dw_blocks = at::zeros_like(dw);
    for (int64_t b = 0; b < 2; ++b) {
      w.mutable_grad() = at::Tensor();
      const at::Tensor part = xs.narrow(1, b * S, S).clone().requires_grad_(true);
      const at::Tensor yb = batched_linear(part, w, *mp, 1);
      yb.backward(dy.narrow(1, b * S, S));
      EXPECT_TRUE(at::equal(yb, y.narrow(1, b * S, S))) << "block " << b;
      EXPECT_TRUE(at::equal(part.grad(), dx.narrow(1, b * S, S))) << "block " << b;
      dw_blocks += w.grad();
    }
    EXPECT_TRUE(at::equal(dw, dw_blocks));
    // Grouped: the same rows in one [E * 2S, K] buffer, a group per (expert, block).
    w.mutable_grad() = at::Tensor();
    const at::Tensor rows = xs.reshape({E * 2 * S, K}).clone().requires_grad_(true);
    const at::Tensor group = at::arange(E * 2, at::kLong).repeat_interleave(S);
    const at::Tensor counts = at::full({E}, 2 * S, at::kLong);
    const at::Tensor yg = fp8_grouped_linear(rows, w, counts, group, E * 2, *mp, *mp->fp8_split(w));
    yg.backward(dy.reshape({E * 2 * S, N}));
    const auto rel = [](const at::Tensor& a, const at::Tensor& b) {
      return max_abs(a.to(at::kDouble) - b.to(at::kDouble)) / max_abs(b.to(at::kDouble));
    };
    EXPECT_LE(rel(yg, y.reshape({E * 2 * S, N})), std::ldexp(1.0, -8));
    EXPECT_LE(rel(rows.grad(), dx.reshape({E * 2 * S, K})), std::ldexp(1.0, -8));
    EXPECT_LE(rel(w.grad(), dw), 1e-5);
  }
}

// Zero-bubble schedules: with the weight gradients deferred (a B pass) the
// FP8 products are queued with their operands quantized, and the W pass
// adds exactly what an undeferred backward gives.
TEST(Fp8Linear, DeferredWeightGradientsAreTheSame) {
  const at::Tensor x = randn({3, 7, 48}, 13).to(at::kBFloat16);
  for (Fp8Recipe r : kRecipes) {
    SCOPED_TRACE(choice_name(r));
    auto mp = precision(r);
    mp->set_split_backward(true);
    const at::Tensor w = param({32, 48}, 14, 0.1), e = param({3, 16, 48}, 15, 0.1);
    mp->mark_fp8(w, std::make_shared<Fp8Split>());
    mp->mark_fp8(e, std::make_shared<Fp8Split>());
    const auto loss = [&] {
      return mp->fused_linear(x, w).to(at::kFloat).pow(2).sum() +
             batched_linear(x.narrow(2, 0, 48), e, *mp).to(at::kFloat).pow(2).sum();
    };
    loss().backward();
    const at::Tensor gw = w.grad().clone(), ge = e.grad().clone();
    loss().backward();  // a second microbatch accumulates
    const at::Tensor gw2 = w.grad().clone(), ge2 = e.grad().clone();
    w.mutable_grad() = at::Tensor();
    e.mutable_grad() = at::Tensor();
    WeightGradQueue q;
    for (int pass = 0; pass < 2; ++pass) {
      mp->defer_weight_grads(&q);
      loss().backward();
      mp->defer_weight_grads(nullptr);
      EXPECT_EQ(q.size(), 2u);
      q.run();
      EXPECT_TRUE(at::equal(w.grad(), pass == 0 ? gw : gw2));
      EXPECT_TRUE(at::equal(e.grad(), pass == 0 ? ge : ge2));
    }
  }
}

// A weight is quantized once per round (CastScope), as its bf16 cast is
// cast once; outside a scope nothing is kept. The LM head, the embedding
// and the router are never marked: they stay as the bf16 policy has them.
TEST(Fp8Linear, QuantizedWeightsSharedWithinARoundAndOnlyTheLinearLayers) {
  for (Fp8Recipe r : kRecipes) {
    SCOPED_TRACE(choice_name(r));
    LayerFactory f;
    f.set_precision(precision(r));
    ModelConfig cfg = test::tiny_model(AttentionKind::Mla, FfnKind::Moe);
    cfg.model_dtype = ModelDtype::Bfloat16;
    cfg.fp8_recipe = r;
    cfg.tie_embeddings = false;
    Transformer m(cfg, f);
    MixedPrecision& mp = *f.precision();
    int64_t marked = 0;
    for (const auto& p : m.named_parameters()) {
      const std::string& name = p.key();
      const bool gemm = p.value().dim() >= 2 && name.find("embed") == std::string::npos &&
                        name.find("head") == std::string::npos && name.find("router") == std::string::npos;
      EXPECT_EQ(mp.fp8_split(p.value()) != nullptr, gemm) << name;
      marked += gemm;
    }
    EXPECT_GT(marked, 10);
    const at::Tensor w = m.named_parameters()["layers.0.attn.wo.weight"];
    {
      CastScope round(mp);
      const auto a = mp.fp8_weight(w, false), b = mp.fp8_weight(w, false);
      EXPECT_EQ(a.data.data_ptr(), b.data.data_ptr());
    }
    EXPECT_NE(mp.fp8_weight(w, false).data.data_ptr(), mp.fp8_weight(w, false).data.data_ptr());
  }
}

// Training on CPU: the tiny dense and MLA + MoE models (dropless and by
// capacity) in bf16 and each recipe, 30 AdamW steps on a fixed batch. FP8
// is in use (every loss differs from bf16's), stays close to bf16 (the last
// loss within 10%), and the loss falls.
TEST(Fp8Training, EachRecipeTrainsCloseToBf16) {
  const auto run = [](ModelConfig cfg, Fp8Recipe r) {
    cfg.model_dtype = ModelDtype::Bfloat16;
    cfg.fp8_recipe = r;
    LayerFactory f;
    f.set_precision(std::make_shared<MixedPrecision>(PrecisionPolicy::from_model_dtype(cfg.model_dtype, r)));
    Transformer m(cfg, f);
    torch::optim::AdamW opt(m.parameters(), torch::optim::AdamWOptions(3e-3));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    const at::Tensor tokens = at::randint(0, cfg.vocab_size, {4, cfg.T + 1}, gen, at::kLong);
    std::vector<double> losses;
    for (int step = 0; step < 30; ++step) {
      opt.zero_grad();
      CastScope round(m.precision());
      ForwardAux aux;
      const at::Tensor loss = m.loss(tokens.narrow(1, 0, cfg.T), tokens.narrow(1, 1, cfg.T), &aux);
      (aux.aux_loss.defined() ? loss + 0.01 * aux.aux_loss : loss).backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  ModelConfig dense = test::tiny_model(AttentionKind::Mha, FfnKind::Dense);
  ModelConfig moe = test::tiny_model(AttentionKind::Mla, FfnKind::Moe);
  ModelConfig capacity = moe;
  capacity.capacity_factor = 1.5;
  for (const ModelConfig& cfg : {dense, moe, capacity}) {
    const std::vector<double> bf16 = run(cfg, Fp8Recipe::None);
    EXPECT_LT(bf16.back(), 0.8 * bf16.front());
    for (Fp8Recipe r : kRecipes) {
      SCOPED_TRACE(std::string(choice_name(cfg.ffn)) + " cf " + std::to_string(cfg.capacity_factor) + " " +
                   choice_name(r));
      const std::vector<double> fp8 = run(cfg, r);
      size_t same = 0;
      for (size_t i = 0; i < fp8.size(); ++i) same += fp8[i] == bf16[i];
      EXPECT_EQ(same, 0u) << "a loss equal to bf16's: FP8 not in use";
      EXPECT_LT(fp8.back(), 0.8 * fp8.front()) << "the loss does not fall";
      EXPECT_NEAR(fp8.back(), bf16.back(), 0.1 * bf16.back());
      std::printf("%-5s cf %.2f %-10s loss %.4f -> %.4f (bf16 %.4f -> %.4f)\n", choice_name(cfg.ffn),
                  cfg.capacity_factor, choice_name(r), fp8.front(), fp8.back(), bf16.front(), bf16.back());
    }
  }
}

// The meta device (bench --device meta) runs the same program: shapes only.
TEST(Fp8Linear, RunsOnTheMetaDevice) {
  for (Fp8Recipe r : kRecipes) {
    auto mp = precision(r);
    const at::Tensor w = at::empty({64, 256}, at::TensorOptions().device(at::kMeta)).requires_grad_(true);
    mp->mark_fp8(w, std::make_shared<Fp8Split>());
    const at::Tensor x = at::empty({2, 8, 256}, at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16));
    const at::Tensor y = mp->fused_linear(x.requires_grad_(true), w);
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 8, 64}));
    y.sum().backward();
    EXPECT_EQ(w.grad().sizes(), w.sizes());
  }
}
