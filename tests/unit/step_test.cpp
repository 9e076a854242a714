// The GPU-shaped step, lever by lever, each against the computation it
// replaced (CPU, fp32: same values and gradients), and the performance model
// (op observer + meta kernels) on known operators.
#include <gtest/gtest.h>
#include <functional>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "meshtrain/config/load.h"
#include "meshtrain/dist/runtime.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/model/cross_entropy.h"
#include "meshtrain/model/gelu_matmul.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/bench/meta_bench.h"
#include "meshtrain/perf/meta_kernels.h"
#include "meshtrain/perf/op_observer.h"
#include "meshtrain/perf/graph_safety.h"
#include "meshtrain/perf/path_counter.h"
#include "meshtrain/ops/fp8.h"
#include "meshtrain/ops/fused.h"
#include "meshtrain/ops/gelu_gemm.h"
#include "meshtrain/train/step.h"

namespace meshtrain {
namespace {

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
}

// The step's statistics are copied when the step ends (start_read), not
// when they are read after the next step is enqueued: read() returns the
// values of that moment, whatever the device tensors hold later, and waits
// for nothing (CPU: the copy has landed). On a GPU, Cuda.StepStatsReadWaits-
// ForItsOwnStepOnly shows the read does not wait for the next step.
TEST(Step, StatsAreCopiedWhenTheStepEndsAndReadLater) {
  StepStats st;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  st.sums.ce = at::full({1}, 24.0, f64);
  st.sums.aux = at::full({1}, 2.0, f64);
  st.sums.z = at::zeros({1}, f64);
  st.sums.dropped = at::full({1}, 1.0, f64);
  st.sums.assigned = at::full({1}, 4.0, f64);
  st.sums.expert_tokens = at::tensor({3.0, 1.0}, f64).reshape({1, 2});
  st.sums.mtp = at::zeros({0}, f64);  // no multi-token prediction depth
  st.grad_norm_t = at::full({}, 0.5, f64);
  st.tokens = 8;
  st.seq_len = 4;
  st.start_read();
  EXPECT_TRUE(st.landed());
  // The next step reuses and overwrites what the sums pointed at.
  for (at::Tensor* f : st.sums.fields()) f->fill_(-7.0);
  st.grad_norm_t.fill_(99.0);
  st.read();
  EXPECT_DOUBLE_EQ(st.loss, 3.0);
  EXPECT_DOUBLE_EQ(st.aux_loss, 1.0);  // 2 over 8 / 4 sequences
  EXPECT_DOUBLE_EQ(st.dropped_fraction, 0.25);
  EXPECT_DOUBLE_EQ(st.grad_norm, 0.5);
  ASSERT_EQ(st.expert_fraction.size(), 1u);
  EXPECT_DOUBLE_EQ(st.expert_fraction[0][0], 0.75);
  // read() without start_read() copies then (the values at the read).
  StepStats late;
  late.sums = st.sums;
  late.tokens = 8;
  late.read();
  EXPECT_DOUBLE_EQ(late.loss, -7.0 / 8);
}

// Every fused operator names the path it took (ops/paths.h): rows of whole
// 16-byte vectors take the fast path, a 42-wide row falls back with its
// reason, and the counter sees the backward's kernels too. Nothing is
// counted once the counter is gone.
TEST(Step, FusedOperatorsNameThePathTheyTook) {
  const at::Tensor w48 = randn({48}, 1) + 1, w42 = randn({42}, 2) + 1;
  std::map<std::string, OpPaths> c;
  {
    PathCounter counter;
    const at::Tensor a = randn({5, 48}, 3).requires_grad_(true), b = randn({5, 42}, 4).requires_grad_(true);
    (ops::rms_norm(a, w48, {}, 1e-6).sum() + ops::rms_norm(b, w42, {}, 1e-6).sum()).backward();
    ops::linear_gelu(randn({4, 8}, 5), randn({16, 8}, 6), std::nullopt);
    c = counter.counts();
  }
  ASSERT_TRUE(c.count("rms_norm_fwd") && c.count("rms_norm_bwd") && c.count("linear_gelu"));
  for (const char* op : {"rms_norm_fwd", "rms_norm_bwd"}) {
    EXPECT_EQ(c[op].fast, 1) << op;
    EXPECT_EQ(c[op].fast_paths["16-byte vectors"], 1) << op;
    EXPECT_EQ(c[op].fallback, 1) << op;
    EXPECT_EQ(c[op].fallback_reasons["row length not a multiple of the 16-byte vector"], 1) << op;
  }
  EXPECT_EQ(c["linear_gelu"].fast_paths["CPU kernel"], 1);
  const nlohmann::json j = paths_json(c);
  EXPECT_EQ(j["rms_norm_bwd"]["fallback"], 1);
  EXPECT_NE(paths_text(c).find("because row length not a multiple"), std::string::npos) << paths_text(c);
  PathCounter again;  // a new counter starts from nothing and sees only what runs while it lives
  EXPECT_TRUE(again.counts().empty());
}

// The graph-safety check (device_config.cuda_graphs) sees a host read and
// names its operator, and tells memory use that changes between two steps
// from memory use that repeats.
TEST(Step, FootprintsShowHostReadsAndChangingMemory) {
  const at::Tensor x = randn({64, 32}, 1);
  auto record = [&](const std::function<void()>& f) {
    StepFootprintRecorder r(at::kCPU);
    f();
    return r.finish();
  };
  const auto step = [&] { (void)(at::matmul(x, x.t()) + 1).sum(); };
  const StepFootprint a = record(step), b = record(step);
  EXPECT_EQ(a.host_reads, 0);
  EXPECT_FALSE(a.allocations.empty());
  EXPECT_EQ(graph_unsafe_reason(a, b), "");
  const StepFootprint read = record([&] { (void)x.sum().item<double>(); });
  EXPECT_EQ(read.host_reads, 1);
  const std::string why = graph_unsafe_reason(read, read);
  EXPECT_NE(why.find("aten::_local_scalar_dense"), std::string::npos) << why;
  const StepFootprint more = record([&] {
    step();
    (void)at::empty({1024});
  });
  EXPECT_NE(graph_unsafe_reason(a, more).find("memory use differs"), std::string::npos);
  const StepFootprint other = record([&] { (void)(at::matmul(x.narrow(0, 0, 32), x.t()) + 1).sum(); });
  EXPECT_NE(graph_unsafe_reason(a, other).find("bytes where the step before"), std::string::npos);
}

// Lever 1: the fused rms_norm is the old fp32 chain, bit for bit on CPU.
TEST(Step, RmsNormMatchesTheFp32Chain) {
  RMSNorm norm(8);
  at::NoGradGuard ng;
  norm.named_parameters()["weight"].copy_(randn({8}, 1));
  const at::Tensor x = randn({3, 5, 8}, 2);
  const at::Tensor w = norm.named_parameters()["weight"];
  const at::Tensor ref = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * w;
  EXPECT_TRUE(at::equal(norm.forward(x), ref));
}

at::Tensor old_rope(const at::Tensor& x, int64_t offset, double theta) {
  const int64_t dim = x.size(-1), T = x.size(-2);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const auto inv_freq = at::pow(theta, -at::arange(0, dim, 2, f32) / static_cast<double>(dim));
  const auto angle = at::outer(at::arange(offset, offset + T, f32), inv_freq);
  const auto cos = at::cat({angle.cos(), angle.cos()}, -1), sin = at::cat({angle.sin(), angle.sin()}, -1);
  const auto h = x.chunk(2, -1);
  return x * cos + at::cat({-h[1], h[0]}, -1) * sin;
}

// Lever 2: cached tables, q and k rotated together ([B, T, 2, H, dim]), the
// custom backward: the old values and gradients exactly.
TEST(Step, RotaryMatchesTheOldRopeWithGradients) {
  Rotary rope(10000.0);
  for (int64_t offset : {0, 5, 2}) {  // 2 after 5: served from the longer cached table
    const at::Tensor x = randn({2, 6, 2, 3, 8}, 3).requires_grad_(true);
    const at::Tensor g = randn({2, 6, 2, 3, 8}, 4);
    const at::Tensor y = rope.apply(x, offset, 1);
    const at::Tensor xr = x.detach().clone().requires_grad_(true);
    const at::Tensor ref = old_rope(xr.permute({0, 2, 3, 1, 4}), offset, 10000.0).permute({0, 3, 1, 2, 4});
    EXPECT_TRUE(at::equal(y, ref)) << offset;
    y.backward(g);
    ref.backward(g);
    EXPECT_TRUE(at::equal(x.grad(), xr.grad())) << offset;
  }
}

// Lever 3: the fused QKV projection computes what three linears did.
TEST(Step, FusedQkvMatchesThreeProjections) {
  ModelConfig c;
  c.model_dimension = 16;
  c.n_head = 4;
  c.blocks = 1;
  c.layers_per_block = 1;
  c.T = 8;
  c.init_std = 0.2;
  LayerFactory f;
  f.set_seed(7);
  MHA mha(c, f, "attn");
  auto p = mha.named_parameters();
  const at::Tensor x = randn({2, 8, 16}, 5).requires_grad_(true);
  const at::Tensor y = mha.forward(x, nullptr, 0);
  // Reference: the pre-fusion forward from the same weights.
  auto heads = [](const at::Tensor& t) { return t.view({2, 8, 4, 4}).transpose(1, 2); };
  const at::Tensor xr = x.detach().clone().requires_grad_(true);
  const at::Tensor q = old_rope(heads(at::linear(xr, p["wq.weight"])), 0, c.rope_theta);
  const at::Tensor k = old_rope(heads(at::linear(xr, p["wk.weight"])), 0, c.rope_theta);
  const at::Tensor v = heads(at::linear(xr, p["wv.weight"]));
  const at::Tensor o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
  const at::Tensor ref = at::linear(o.transpose(1, 2).reshape({2, 8, 16}), p["wo.weight"]);
  EXPECT_TRUE(at::allclose(y, ref, 1e-5, 1e-6));
  y.sum().backward();
  const at::Tensor gw = p["wq.weight"].grad().clone();
  for (auto& kv : p) kv.value().mutable_grad() = at::Tensor();
  ref.sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), xr.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(gw, p["wq.weight"].grad(), 1e-5, 1e-6));
}

// Lever 5: a found_inf update is skipped on the device and is no step.
TEST(Step, FusedAdamWSkipsOnFoundInf) {
  LrConfig cfg;
  cfg.weight_decay = 0.1;
  at::Tensor w = torch::tensor({1.0f, -2.0f}).requires_grad_(true);
  AdamW opt({{"w", w, true, {}, {}}}, cfg);
  w.mutable_grad() = torch::tensor({0.5f, 0.5f});
  opt.step(0.1, at::ones({}, at::kFloat));
  EXPECT_TRUE(at::equal(w, torch::tensor({1.0f, -2.0f})));
  EXPECT_EQ(opt.steps_taken(), 0);
  opt.step(0.1, at::zeros({}, at::kFloat));
  EXPECT_FALSE(at::equal(w, torch::tensor({1.0f, -2.0f})));
  EXPECT_EQ(opt.steps_taken(), 1);
}

// The observer: GEMM FLOPs from shapes, views are no kernels, item() is a
// host sync, fused ops count once.
TEST(Step, ObserverCountsKernelsFlopsBytesAndSyncs) {
  install_meta_kernels();
  const auto meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  const at::Tensor a = at::empty({64, 32}, meta), b = at::empty({32, 16}, meta);
  OpObserver obs(at::Device(at::kMeta));
  at::Tensor c = at::mm(a, b);                      // 1 GEMM kernel
  at::Tensor d = c.view({16, 64}).transpose(0, 1);  // views: nothing
  at::Tensor e = d.contiguous();                    // 1 copy kernel
  at::Tensor f = e * 2.0;                           // 1 kernel
  (void)f.sum().item<float>();                      // 1 kernel + 1 host sync
  std::vector<at::Tensor> list = {a, b};
  at::_foreach_mul_(list, 2.0);                     // one fused kernel
  const OpTotals& t = obs.totals();
  EXPECT_DOUBLE_EQ(t.gemm_flop, 2.0 * 64 * 32 * 16);
  EXPECT_EQ(t.kernels, 5);
  EXPECT_EQ(t.host_syncs, 1);
  // copy 2x4KiB, mul 2x4KiB, sum 4KiB + 4 B, foreach read+write of a and b
  const double n = 64 * 16 * 4;
  EXPECT_DOUBLE_EQ(t.other_bytes, 2 * n + 2 * n + n + 4 + 2 * (64 * 32 + 32 * 16) * 4.0);
}

// FP8 (ops/fp8.h) on meta: a quantization is one memory-bound kernel that
// reads its input twice (the amax, then the scaled cast; once when the amax
// is given) and writes the fp8 values and the scales; an FP8 GEMM is one
// GEMM whose FLOPs go to fp8_gemm_flop (priced at the FP8 peak), not
// gemm_flop, whatever the emulation computes inside.
TEST(Step, ObserverCountsFp8GemmsAndQuantizations) {
  install_meta_kernels();
  const auto meta = at::TensorOptions().dtype(at::kBFloat16).device(at::kMeta);
  const at::Tensor x = at::empty({64, 256}, meta), w = at::empty({32, 256}, meta);
  OpObserver obs(at::Device(at::kMeta));
  const ops::Fp8Tensor xq = ops::quantize_fp8(x, at::kFloat8_e4m3fn, ops::Fp8Granularity::kTile);
  const ops::Fp8Tensor wq = ops::quantize_fp8(w, at::kFloat8_e4m3fn, ops::Fp8Granularity::kBlock);
  const at::Tensor y = ops::fp8_mm(xq, wq, at::kBFloat16);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{64, 32}));
  const OpTotals& t = obs.totals();
  EXPECT_EQ(t.kernels, 3);
  EXPECT_DOUBLE_EQ(t.gemm_flop, 0);
  EXPECT_DOUBLE_EQ(t.fp8_gemm_flop, 2.0 * 64 * 32 * 256);
  // x: 2 reads of bf16 + fp8 values + 64 x 2 fp32 scales; w: the same with 1 x 2 scales.
  EXPECT_DOUBLE_EQ(t.other_bytes, (64 * 256 * 5 + 64 * 2 * 4) + (32 * 256 * 5 + 2 * 4));
  // The GEMM: both fp8 operands and their scales read, bf16 written.
  EXPECT_DOUBLE_EQ(t.fp8_gemm_bytes, 64 * 256 + 64 * 2 * 4 + 32 * 256 + 2 * 4 + 64 * 32 * 2);
}

// Flash attention on meta: picked for bf16 with equal head sizes, FLOPs of
// forward (2 products) and backward (5), causal halves.
TEST(Step, MetaAttentionIsFlashWithFlops) {
  install_meta_kernels();
  const auto meta = at::TensorOptions().dtype(at::kBFloat16).device(at::kMeta);
  const at::Tensor q = at::empty({2, 3, 128, 64}, meta).requires_grad_(true);
  OpObserver obs(at::Device(at::kMeta));
  const at::Tensor o = at::scaled_dot_product_attention(q, q, q, {}, 0.0, true);
  o.backward(at::empty_like(o));
  const double tt = 2.0 * 3 * 128 * 128 * 0.5;
  EXPECT_DOUBLE_EQ(obs.totals().attention_flop, 2 * tt * 128 + 2 * tt * (3 * 64 + 2 * 64));
  EXPECT_EQ(obs.totals().by_op.count("aten::_scaled_dot_product_flash_attention"), 1u);
  EXPECT_EQ(obs.totals().by_op.count("aten::_scaled_dot_product_flash_attention_backward"), 1u);
}

// The experts' GEMM with the fp32 master weight: the values and both
// gradients of plain autograd through a cast (fp32: the same numbers; bf16:
// the weight gradient is the fp32 sum of the bf16 products, not a bf16 result
// cast up), and no copy or cast of the gradient afterwards (meta, counted).
TEST(Step, BatchedLinearGivesTheWeightGradientInFp32) {
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
TEST(Step, LinearWeightGradientsLeaveTheGemmInFp32) {
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
TEST(Step, TiedEmbeddingAddsItsRowsToTheHeadsGradient) {
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
TEST(Step, KeptCastsAreFreshCastsWrittenByTheOptimizer) {
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
TEST(Step, PaddedVocabularyHeadCountsOnlyTheRealColumns) {
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

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// Gradient accumulation inside the weight-gradient GEMMs (mixed_matmul.h's
// param_weight_grad): a second microbatch's weight gradients are added into
// the first's by the GEMMs, in place, and equal the two passes' gradients
// summed; a parameter whose accumulation is hooked (the dp buckets) gets
// its hook run once a pass either way; on meta the second pass has no add.
// Every user: a fused linear of two weights, the experts' batched GEMM and
// the GELU pair.
TEST(Step, WeightGradientsAccumulateInsideTheirGemms) {
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
