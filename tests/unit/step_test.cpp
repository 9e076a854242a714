// The GPU-shaped step, lever by lever, each against the computation it
// replaced (CPU, fp32: same values and gradients), and the performance model
// (op observer + meta kernels) on known operators. The weight gradients'
// levers: weight_grad_test.cpp.
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
#include "seeded_randn.h"

namespace meshtrain {
namespace {

using test_util::randn;

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
}  // namespace
}  // namespace meshtrain
