// Weight gradients out of their GEMMs: in fp32 for bf16 compute, added into
// a parameter's gradient inside the GEMM across microbatches, a tied
// embedding's rows summed with the head's, the padded vocabulary's columns
// left out, and the casts the optimizer keeps (CPU against plain autograd;
// the bytes and kernels on the meta device).
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <functional>

#include "meshtrain/model/cross_entropy.h"
#include "meshtrain/model/gelu_matmul.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/perf/meta_kernels.h"
#include "meshtrain/perf/op_observer.h"
#include "seeded_randn.h"

namespace meshtrain {
namespace {

using test_util::randn;

// The experts' GEMM with the fp32 master weight: the values and both
// gradients of plain autograd through a cast (fp32: the same numbers; bf16:
// the weight gradient is the fp32 sum of the bf16 products, not a bf16 result
// cast up), and no copy or cast of the gradient afterwards (meta, counted).
TEST(WeightGrad, BatchedLinearGivesTheWeightGradientInFp32) {
  for (ModelDtype dt : {ModelDtype::Float32, ModelDtype::Bfloat16}) {
    MixedPrecision mp(PrecisionPolicy::from_model_dtype(dt));
    const at::ScalarType c = mp.policy().compute;
    const at::Tensor w = randn({3, 5, 4}, 30).requires_grad_(true);
    const at::Tensor x = randn({3, 6, 4}, 31).to(c).requires_grad_(true);
    const at::Tensor g = randn({3, 6, 5}, 32).to(c);
    at::Tensor y;
    {
      CastScope scope(mp);
      y = batched_linear(x, w, mp);
    }
    y.backward(g);
    EXPECT_EQ(y.scalar_type(), c);
    EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
    EXPECT_TRUE(w.grad().is_contiguous());
    const at::Tensor wc = w.detach().to(c), xr = x.detach().clone().requires_grad_(true);
    const at::Tensor ref = at::bmm(xr, wc.transpose(1, 2));
    ref.backward(g);
    EXPECT_TRUE(at::allclose(y.to(at::kFloat), ref.to(at::kFloat), 1e-6, 1e-6)) << choice_name(dt);
    EXPECT_TRUE(at::allclose(x.grad().to(at::kFloat), xr.grad().to(at::kFloat), 1e-6, 1e-6)) << choice_name(dt);
    const at::Tensor dw = at::bmm(g.to(at::kFloat).transpose(1, 2), x.detach().to(at::kFloat));
    EXPECT_TRUE(at::allclose(w.grad(), dw, 1e-6, 1e-6)) << choice_name(dt);
  }
  install_meta_kernels();
  MixedPrecision mp(PrecisionPolicy::from_model_dtype(ModelDtype::Bfloat16));
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor w = at::empty({4, 64, 32}, meta.dtype(at::kFloat)).requires_grad_(true);
  const at::Tensor x = at::empty({4, 16, 32}, meta.dtype(at::kBFloat16)).requires_grad_(true);
  OpObserver obs(at::Device(at::kMeta));
  {
    CastScope scope(mp);
    batched_linear(x, w, mp).backward(at::empty({4, 16, 64}, meta.dtype(at::kBFloat16)));
  }
  // The forward's cast of w (4 B read, 2 B written per element) is the only copy.
  ASSERT_EQ(obs.totals().by_op.count("aten::copy_"), 1u);
  EXPECT_DOUBLE_EQ(obs.totals().by_op.at("aten::copy_").bytes, 4 * 64 * 32 * 6.0);
  EXPECT_EQ(obs.totals().by_op.at("aten::copy_").calls, 1);
}

// The linear layers of a bf16 model (MixedPrecision::fused_linear): the
// outputs and input gradient of at::linear over the casts, bit for bit, and
// the weights' and biases' gradients the fp32 sums of the bf16 products (not
// bf16 results cast up): one GEMM for three weights (q, k, v: each gets its
// rows), and a residual folded into the GEMM. Nothing casts a gradient
// afterwards (meta, counted); an fp32 model takes at::linear as it was.
TEST(WeightGrad, LinearWeightGradientsLeaveTheGemmInFp32) {
  const at::ScalarType bf16 = at::kBFloat16;
  MixedPrecision mp(PrecisionPolicy::from_model_dtype(ModelDtype::Bfloat16));
  std::vector<at::Tensor> w, b;
  for (int64_t i = 0; i < 3; ++i) {
    w.push_back(randn({i == 2 ? 5 : 6, 4}, 50 + i).requires_grad_(true));
    b.push_back(randn({i == 2 ? 5 : 6}, 60 + i).requires_grad_(true));
  }
  const at::Tensor x = randn({2, 3, 4}, 55).to(bf16).requires_grad_(true), g = randn({2, 3, 17}, 56).to(bf16);
  at::Tensor y;
  {
    CastScope scope(mp);
    y = mp.fused_linear(x, w, b);
  }
  y.backward(g);
  const at::Tensor W = at::cat(w).detach().to(bf16), B = at::cat(b).detach().to(bf16);
  const at::Tensor xr = x.detach().clone().requires_grad_(true);
  const at::Tensor ref = at::linear(xr, W, B);
  ref.backward(g);
  EXPECT_TRUE(at::equal(y, ref));
  EXPECT_TRUE(at::equal(x.grad(), xr.grad()));
  const at::Tensor gf = g.to(at::kFloat).reshape({-1, 17}), xf = x.detach().to(at::kFloat).reshape({-1, 4});
  const at::Tensor dW = at::mm(gf.t(), xf), dB = gf.sum(0);
  for (int64_t i = 0, row = 0; i < 3; row += w[i].size(0), ++i) {
    ASSERT_EQ(w[i].grad().scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(w[i].grad(), dW.narrow(0, row, w[i].size(0)))) << "weight " << i;
    EXPECT_TRUE(at::allclose(b[i].grad(), dB.narrow(0, row, w[i].size(0)), 1e-6, 1e-6)) << "bias " << i;
    EXPECT_FALSE(at::equal(w[i].grad(), w[i].grad().to(bf16).to(at::kFloat))) << "a bf16 product cast up";
  }

  // The residual folded into the GEMM: its gradient is the output's.
  const at::Tensor r = randn({2, 3, 6}, 57).to(bf16).requires_grad_(true);
  w[0].mutable_grad() = at::Tensor();
  const at::Tensor x2 = x.detach().clone().requires_grad_(true);
  const at::Tensor y2 = mp.fused_linear(x2, w[0], {}, r);
  const at::Tensor g2 = g.narrow(-1, 0, 6).contiguous();
  y2.backward(g2);
  EXPECT_TRUE(at::allclose(y2.to(at::kFloat), (r + at::linear(x, W.narrow(0, 0, 6))).detach().to(at::kFloat), 1e-2, 1e-2));
  EXPECT_TRUE(at::equal(r.grad(), g2));
  EXPECT_TRUE(at::equal(w[0].grad(), at::mm(g2.to(at::kFloat).reshape({-1, 6}).t(), xf)));

  // fp32: at::linear itself.
  MixedPrecision fp32;
  const at::Tensor w32 = randn({6, 4}, 58).requires_grad_(true), x32 = randn({2, 3, 4}, 59);
  fp32.fused_linear(x32, w32).backward(g.narrow(-1, 0, 6).to(at::kFloat));
  const at::Tensor w32r = w32.detach().clone().requires_grad_(true);
  at::linear(x32, w32r).backward(g.narrow(-1, 0, 6).to(at::kFloat));
  EXPECT_TRUE(at::equal(w32.grad(), w32r.grad()));

  install_meta_kernels();
  const auto meta = at::TensorOptions().device(at::kMeta);
  std::vector<at::Tensor> wm;
  for (int64_t i = 0; i < 3; ++i) wm.push_back(at::empty({64, 32}, meta.dtype(at::kFloat)).requires_grad_(true));
  const at::Tensor xm = at::empty({16, 32}, meta.dtype(bf16)).requires_grad_(true);
  OpObserver obs(at::Device(at::kMeta));
  mp.fused_linear(xm, wm).backward(at::empty({16, 192}, meta.dtype(bf16)));
  // The forward's three casts of the weights are the only copies.
  ASSERT_EQ(obs.totals().by_op.count("aten::copy_"), 1u);
  EXPECT_EQ(obs.totals().by_op.at("aten::copy_").calls, 3);
}

// A tied embedding's gradient (bf16, one stage): the head's backward leaves
// its fp32 [V, d] gradient for the embedding's, which adds its rows into it
// (mixed_matmul.h's TiedGrad) -- the sum of what an untied head and embedding
// holding the same values get, to fp32 round-off; nothing is left over for
// the next pass (a second identical pass doubles the gradient exactly).
TEST(WeightGrad, TiedEmbeddingAddsItsRowsToTheHeadsGradient) {
  auto mp = std::make_shared<MixedPrecision>(PrecisionPolicy::from_model_dtype(ModelDtype::Bfloat16));
  const int64_t V = 200, d = 8, N = 40;
  LayerFactory f;
  f.set_seed(5);
  f.set_precision(mp);
  auto emb = f.embedding("embed", V, d, 0.5);
  auto tied = f.head("head", d, V, 0.5, emb);
  auto emb2 = f.embedding("embed2", V, d, 0.5);
  auto untied = f.head("head2", d, V, 0.5, nullptr);
  {
    at::NoGradGuard no_grad;
    emb2->weight().copy_(emb->weight());
    untied->parameters()[0].copy_(emb->weight());
  }
  // Tokens repeat (a row gets several rows' gradients) and some are targets.
  const at::Tensor tokens = at::randint(0, 50, {N}, at::make_generator<at::CPUGeneratorImpl>(9), at::kLong);
  const at::Tensor targets = (tokens * 3 + 1) % V;
  const auto pass = [&](Embedding& e, LMHead& h) {
    CastScope scope(*mp);
    h.token_losses(e.forward(tokens).view({1, N, d}), targets.view({1, N})).sum().backward();
  };
  pass(*emb, *tied);
  pass(*emb2, *untied);
  const at::Tensor got = emb->weight().grad().clone();
  const at::Tensor want = emb2->weight().grad() + untied->parameters()[0].grad();
  ASSERT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(got, want, 1e-6, 1e-6)) << (got - want).abs().max().item<double>();
  EXPECT_GT(emb2->weight().grad().abs().sum().item<double>(), 0.0);
  pass(*emb, *tied);
  EXPECT_TRUE(at::equal(emb->weight().grad(), got * 2)) << "a gradient was left over or lost between passes";
}

// Kept casts (mixed_precision.h): read through operand (with autograd) and
// operand_detached (padded), they are fresh casts bit for bit and give the
// gradient Tensor::to gives; the optimizer's update writes them (no cast made
// on the next round); a write to a parameter outside the optimizer (a
// checkpoint load) is seen, and the next read casts again.
TEST(WeightGrad, KeptCastsAreFreshCastsWrittenByTheOptimizer) {
  MixedPrecision mp(PrecisionPolicy::from_model_dtype(ModelDtype::Bfloat16));
  const at::Tensor w = randn({6, 4}, 40).requires_grad_(true);
  const at::Tensor e = randn({5, 4}, 41).requires_grad_(true);  // read padded to 8 rows, like a vocabulary
  const at::Tensor other = randn({3, 4}, 42).requires_grad_(true);  // not kept: cast every round
  mp.keep_casts({w, e});
  const auto fresh = [](const at::Tensor& t) { return t.detach().to(at::kBFloat16); };
  const at::Tensor x = randn({3, 4}, 43).to(at::kBFloat16);
  {
    CastScope scope(mp);
    const at::Tensor wc = mp.operand(w);
    EXPECT_TRUE(at::equal(wc, fresh(w)));
    EXPECT_TRUE(mp.operand(w).is_same(wc)) << "one cast per round";
    const at::Tensor ec = mp.operand_detached(e, 8);
    ASSERT_EQ(ec.size(0), 8);
    EXPECT_TRUE(at::equal(ec.narrow(0, 0, 5), fresh(e)));
    EXPECT_EQ(ec.narrow(0, 5, 3).abs().sum().item<float>(), 0.0f);
    at::mm(x, wc.t()).sum().backward();
    mp.operand(other);
  }
  EXPECT_EQ(mp.casts_made(), 3);
  const at::Tensor w2 = w.detach().clone().requires_grad_(true);
  at::mm(x, w2.to(at::kBFloat16).t()).sum().backward();
  EXPECT_TRUE(at::equal(w.grad(), w2.grad())) << "the gradient Tensor::to's backward gives";
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);

  e.mutable_grad() = randn({5, 4}, 44);
  AdamW opt({{"w", w, true, {}, {}}, {"e", e, false, {}, {}}}, LrConfig{}, at::kFloat);
  const std::vector<at::Tensor> casts = {mp.cast_to_write(w), mp.cast_to_write(e)};
  ASSERT_TRUE(casts[0].defined() && casts[1].defined());
  EXPECT_EQ(casts[1].sizes(), e.sizes());
  EXPECT_FALSE(mp.cast_to_write(other).defined());
  const at::Tensor w_before = w.detach().clone();
  opt.step(1e-2, {}, {}, casts);
  mp.casts_written({w, e});
  ASSERT_FALSE(at::equal(w.detach(), w_before));
  {
    CastScope scope(mp);
    EXPECT_TRUE(at::equal(mp.operand(w), fresh(w))) << "the optimizer's cast of the updated weight";
    EXPECT_TRUE(at::equal(mp.operand_detached(e, 8).narrow(0, 0, 5), fresh(e)));
    mp.operand(other);
  }
  EXPECT_EQ(mp.casts_made(), 4) << "only the parameter that is not kept was cast";
  {
    at::NoGradGuard no_grad;
    w.detach().add_(1.0);  // as a checkpoint load writes it
  }
  {
    CastScope scope(mp);
    EXPECT_TRUE(at::equal(mp.operand(w), fresh(w))) << "a stale kept cast was used";
  }
  EXPECT_EQ(mp.casts_made(), 5);
}

// The head over an odd vocabulary: GEMMs over padded_vocab(V) columns, losses
// and gradients of exactly V (fp32: the unpadded aten values; bf16: one
// padded cast shared by the tied embedding and the head, gradients fp32 [V, d]).
TEST(WeightGrad, PaddedVocabularyHeadCountsOnlyTheRealColumns) {
  EXPECT_EQ(padded_vocab(100277), 100352);
  EXPECT_EQ(padded_vocab(50304), 50304);
  EXPECT_EQ(padded_vocab(1), 128);
  for (ModelDtype dt : {ModelDtype::Float32, ModelDtype::Bfloat16}) {
    auto mp = std::make_shared<MixedPrecision>(PrecisionPolicy::from_model_dtype(dt));
    const int64_t V = 200, d = 8, N = 12;
    LayerFactory f;
    f.set_seed(3);
    f.set_precision(mp);
    auto emb = f.embedding("embed", V, d, 0.5);
    auto head = f.head("head", d, V, 0.5, emb);
    const at::Tensor tokens = at::randint(0, V, {N}, at::make_generator<at::CPUGeneratorImpl>(8), at::kLong);
    const at::Tensor targets = (tokens * 7 + 3) % V;
    at::Tensor loss;
    {
      CastScope scope(*mp);
      const at::Tensor h = emb->forward(tokens);
      loss = head->token_losses(h.view({1, N, d}), targets.view({1, N})).sum();
      // bf16: one padded cast for the lookup and the head; fp32: the head's padded copy.
      EXPECT_EQ(mp->cached(), 1u);
    }
    loss.backward();
    const at::Tensor w = emb->weight();
    EXPECT_EQ(w.grad().sizes(), w.sizes());
    EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
    // Reference: unpadded, in fp32 from the compute-dtype operands.
    const at::Tensor wr = w.detach().to(mp->policy().compute).to(at::kFloat).requires_grad_(true);
    const at::Tensor hr = at::embedding(wr, tokens).to(mp->policy().compute).to(at::kFloat);
    const at::Tensor ref = at::cross_entropy_loss(at::mm(hr, wr.t()), targets, {}, at::Reduction::Sum);
    ref.backward();
    const double tol = dt == ModelDtype::Float32 ? 1e-5 : 2e-2;
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), tol * std::abs(ref.item<double>())) << choice_name(dt);
    EXPECT_TRUE(at::allclose(w.grad(), wr.grad(), tol, tol)) << choice_name(dt) << " max diff "
                                                           << (w.grad() - wr.grad()).abs().max().item<double>();
  }
}

// Gradient accumulation inside the weight-gradient GEMMs (mixed_matmul.h's
// param_weight_grad): a second microbatch's weight gradients are added into
// the first's by the GEMMs, in place, and equal the two passes' gradients
// summed; a parameter whose accumulation is hooked (the dp buckets) gets
// its hook run once a pass either way; on meta the second pass has no add.
// Every user: a fused linear of two weights, the experts' batched GEMM and
// the GELU pair.
TEST(WeightGrad, WeightGradientsAccumulateInsideTheirGemms) {
  MixedPrecision mp(PrecisionPolicy::from_model_dtype(ModelDtype::Bfloat16));
  const std::vector<std::vector<int64_t>> shapes = {{12, 8}, {6, 8}, {3, 5, 8}, {16, 8}, {8, 16}};
  const auto params = [&](const at::TensorOptions& o) {
    std::vector<at::Tensor> p;
    for (size_t i = 0; i < shapes.size(); ++i)
      p.push_back((o.device().is_meta() ? at::empty(shapes[i], o) : randn(shapes[i], 70 + i)).requires_grad_(true));
    return p;
  };
  const auto pass = [&](const std::vector<at::Tensor>& p, const at::Tensor& x) {
    CastScope scope(mp);
    const at::Tensor y1 = mp.fused_linear(x, {p[0], p[1]});
    const at::Tensor y2 = batched_linear(x.reshape({3, 2, 8}), p[2], mp);
    const at::Tensor y3 = gelu_linear(linear_gelu(x, p[3], {}, mp), p[4], {}, {}, mp);
    (y1.to(at::kFloat).sum() + y2.to(at::kFloat).pow(2).sum() + (y3.to(at::kFloat) * 0.5).sum()).backward();
  };
  const at::Tensor x1 = randn({2, 3, 8}, 80).to(at::kBFloat16), x2 = randn({2, 3, 8}, 81).to(at::kBFloat16);
  const auto grads = [](const std::vector<at::Tensor>& p) {
    std::vector<at::Tensor> g;
    for (const at::Tensor& t : p) g.push_back(t.grad().clone());
    return g;
  };

  // Each pass alone, summed: the reference.
  std::vector<at::Tensor> one = params(at::TensorOptions()), two = params(at::TensorOptions());
  pass(one, x1);
  pass(two, x2);
  std::vector<at::Tensor> want = grads(one);
  for (size_t i = 0; i < want.size(); ++i) want[i] += two[i].grad();

  std::vector<at::Tensor> p = params(at::TensorOptions());
  pass(p, x1);
  std::vector<const void*> first;
  for (const at::Tensor& t : p) first.push_back(t.grad().const_data_ptr());
  pass(p, x2);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].grad().const_data_ptr(), first[i]) << "parameter " << i << ": a new gradient buffer";
    EXPECT_TRUE(at::allclose(p[i].grad(), want[i], 1e-5, 1e-6)) << "parameter " << i;
  }

  // Hooked parameters: the engine runs the hook once a pass, in the second
  // one too (where the GEMM added and autograd got no gradient), after the
  // sum is in .grad.
  struct Count : torch::autograd::PostAccumulateGradHook {
    int* n;
    std::vector<at::Tensor>* seen;
    Count(int* c, std::vector<at::Tensor>* s) : n(c), seen(s) {}
    void operator()(const torch::autograd::Variable& v) override {
      ++*n;
      seen->push_back(v.grad().clone());
    }
  };
  std::vector<at::Tensor> h = params(at::TensorOptions());
  int fired[2] = {0, 0};
  std::vector<at::Tensor> seen[2];
  torch::autograd::impl::set_post_acc_grad_hooks(h[0], std::make_unique<Count>(&fired[0], &seen[0]));
  torch::autograd::impl::set_post_acc_grad_hooks(h[2], std::make_unique<Count>(&fired[1], &seen[1]));
  pass(h, x1);
  const void* before = h[2].grad().const_data_ptr();
  pass(h, x2);
  EXPECT_EQ(fired[0], 2);
  EXPECT_EQ(fired[1], 2);
  EXPECT_EQ(h[2].grad().const_data_ptr(), before);
  ASSERT_EQ(seen[0].size(), 2u);
  EXPECT_TRUE(at::allclose(seen[0][1], want[0], 1e-5, 1e-6)) << "the hook saw the pass's sum";
  EXPECT_TRUE(at::allclose(seen[1][1], want[2], 1e-5, 1e-6)) << "the hook saw the pass's sum";
  for (size_t i = 0; i < h.size(); ++i) EXPECT_TRUE(at::allclose(h[i].grad(), want[i], 1e-5, 1e-6)) << "hooked, " << i;

  // Meta, the gradients there from an earlier pass: the GEMMs add, nothing else does.
  install_meta_kernels();
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  std::vector<at::Tensor> m = params(meta);
  for (at::Tensor& t : m) t.mutable_grad() = at::empty_like(t);
  OpObserver obs(at::Device(at::kMeta));
  pass(m, at::empty({2, 3, 8}, meta.dtype(at::kBFloat16)));
  EXPECT_EQ(obs.totals().by_op.count("aten::add_"), 0u);
  EXPECT_EQ(obs.totals().by_op.count("aten::baddbmm"), 1u);
}

}  // namespace
}  // namespace meshtrain
