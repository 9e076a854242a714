// CUDA-only tests; where torch sees no GPU each one skips and says why. One
// GPU is enough: with device_config.collectives "mpi" several ranks share it.
// Runs under mpirun -np 1 (single-process tests), 2 (the one-axis meshes) and
// 8 (the 2x2x2 mesh):
//   - bf16 GPU losses of the first steps against fp32 CPU losses (dense, MoE+MLA);
//   - every mesh with collectives "mpi" gives the losses of one GPU process;
//   - NCCL collectives on one rank, staged MPI collectives on CUDA tensors;
//   - a checkpoint saved from CUDA loads on CPU and back;
//   - resume on GPU is exact with dropout (the CUDA RNG state is saved);
//   - the fused kernels (ops/fused.h) and the grouped GEMM on CUDA give what
//     they give on the CPU, forward and backward, fp32 and bf16;
//   - flash's varlen attention of packed documents / cp chunks equals the mask;
//   - the AdamW kernel (ops/adamw.h) on CUDA gives what its CPU kernel gives,
//     bf16 and fp32 moments, across the multi-tensor launch's table limits;
//   - cuBLASLt takes the GELU GEMMs (ops/gelu_gemm.h) of the GPT-2 and moe1B
//     shapes, and they give what the CPU gives;
//   - a step's statistics are read while the next step still runs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#ifdef MESHTRAIN_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#endif

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/dist/device.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/model/cross_entropy.h"
#include "meshtrain/model/token_layout.h"
#include "meshtrain/ops/adamw.h"
#include "meshtrain/ops/fused.h"
#include "meshtrain/model/gelu_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/ops/gelu_gemm.h"
#include "meshtrain/ops/slot_rows.h"
#include "meshtrain/train/step.h"
#include "ops/kernels.h"
#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("cuda-data");

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA-only test: torch sees no CUDA device in this build/machine"

#define SKIP_UNLESS_RANKS(n)                     \
  if (test_runtime().size() != (n))              \
  GTEST_SKIP() << "runs under mpirun -np " << (n) \
               << " (this run has " << test_runtime().size() << " ranks)"

Config on_gpu(Config c, const char* collectives) {
  c.device.device = DeviceChoice::Cuda;
  c.device.collectives = parse_choice<CollectivesChoice>(collectives).value();
  return c;
}

test::Curve run(const Config& cfg, bool fresh, const std::string& checkpoint = "") {
  SessionOptions o;
  o.fresh = fresh;
  o.quiet = true;
  o.checkpoint = checkpoint;
  Trainer t(cfg, test_runtime(), o);
  t.train();
  return test::curve_of(t);
}

// Every parameter of a trainer, on the CPU, by name.
std::vector<std::pair<std::string, at::Tensor>> params_of(Trainer& t) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : t.model().params) out.emplace_back(p.layout.global_name, p.tensor.detach().cpu().clone());
  return out;
}

void expect_same_params(const std::vector<std::pair<std::string, at::Tensor>>& a,
                        const std::vector<std::pair<std::string, at::Tensor>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << what;
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << what << ": " << a[i].first << " differs";
  }
}

int64_t tri(int p) { return int64_t{p} * (p + 1) / 2; }

void expect_close(const at::Tensor& got, const at::Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor a = got.detach().cpu().to(at::kDouble), b = want.detach().cpu().to(at::kDouble);
  const double err = (a - b).abs().max().item<double>(), scale = b.abs().max().item<double>() + 1e-12;
  EXPECT_LE(err / scale, tol) << what << ": max error " << err << " (scale " << scale << ")";
}

// The fused operators on CUDA (own kernels where the build has nvcc, else
// the aten composites) against their CPU kernels: same inputs, forward and
// backward, fp32 and bf16 storage (fp32 math in both).
TEST(Cuda, FusedKernelsMatchTheirCpuKernels) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  std::cout << "fused kernels on CUDA: " << (ops::have_cuda_kernels() ? "meshtrain's own" : "aten composites")
            << std::endl;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto randn = [&](at::IntArrayRef shape) { return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)); };
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const std::string tag = dt == at::kFloat ? " fp32" : " bf16";
    const double tol = dt == at::kFloat ? 1e-5 : 2e-2;
    const at::Device cuda(at::kCUDA, 0);
    // Each case runs f on CPU leaves and on CUDA copies of them, then compares
    // the outputs and the leaves' gradients under the same upstream gradient.
    auto both = [&](const std::vector<at::Tensor>& leaves,
                    const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& f,
                    const std::string& what) {
      std::vector<at::Tensor> cpu, gpu;
      for (const auto& l : leaves) {
        // Norm weights (the 1-D leaves) stay fp32 under bf16, as the
        // precision policy keeps them: the kernels take only fp32 weights.
        const at::ScalarType ldt = l.dim() == 1 ? at::kFloat : dt;
        cpu.push_back(l.to(ldt).detach().requires_grad_(true));
        gpu.push_back(l.to(ldt).to(cuda).detach().requires_grad_(true));
      }
      const auto yc = f(cpu), yg = f(gpu);
      at::Tensor lc = at::zeros({}, at::kDouble), lg = at::zeros({}, at::TensorOptions(cuda).dtype(at::kDouble));
      for (size_t i = 0; i < yc.size(); ++i) {
        expect_close(yg[i], yc[i], tol, what + " output " + std::to_string(i) + tag);
        const at::Tensor g = randn(yc[i].sizes());
        lc = lc + (yc[i].to(at::kDouble) * g.to(at::kDouble)).sum();
        lg = lg + (yg[i].to(at::kDouble) * g.to(at::kDouble).to(cuda)).sum();
      }
      lc.backward();
      lg.backward();
      for (size_t i = 0; i < cpu.size(); ++i)
        expect_close(gpu[i].grad(), cpu[i].grad(), tol, what + " grad " + std::to_string(i) + tag);
    };
    const auto tables = [&](const at::Tensor& ref) { return ops::rope_tables(16, 40, 10000.0, ref.device()); };
    both({randn({2, 9, 3, 16})}, [&](const auto& v) { return std::vector{ops::rope(v[0], tables(v[0]), 3, 1)}; },
         "rope");
    both({randn({2, 9, 3, 2, 16})},
         [&](const auto& v) {
           auto [q, k, vv] = ops::qkv_rope(v[0], tables(v[0]), 0);
           return std::vector{q, k, vv};
         },
         "qkv_rope");
    const at::Tensor w = randn({48}) + 1;
    both({randn({5, 7, 48}), w}, [&](const auto& v) { return std::vector{ops::rms_norm(v[0], v[1], {}, 1e-6)}; },
         "rms_norm");
    both({randn({5, 7, 48}), randn({5, 7, 48}), w},
         [&](const auto& v) {
           auto [h, y] = ops::add_rms_norm(v[0], v[1], v[2], {}, 1e-6);
           return std::vector{h, y};
         },
         "add_rms_norm");
    both({randn({5, 7, 48}), w},
         [&](const auto& v) {
           auto [r, y] = ops::residual_rms_norm(v[0], v[1], {}, 1e-6);
           return std::vector{r * 0.5, y};
         },
         "residual_rms_norm");
    // The kernels' work splits at real sizes: rope with head size 64 (four
    // threads' chunks of pairs per row, q/k transposed as attention reads
    // them); RMSNorm at 768 (a warp per row, 24 columns a lane, 4096 rows:
    // more rows than partial sums) and at 3072 (a block per row).
    const auto tables64 = [&](const at::Tensor& ref) { return ops::rope_tables(64, 40, 10000.0, ref.device()); };
    both({randn({3, 40, 4, 64})},
         [&](const auto& v) { return std::vector{ops::rope(v[0].transpose(1, 2), tables64(v[0]), 0, 2)}; },
         "rope head 64");
    for (int64_t D : {768, 3072}) {
      const at::Tensor wd = randn({D}) + 1;
      both({randn({4100, D}), randn({4100, D}), wd},
           [&](const auto& v) {
             auto [h, y] = ops::add_rms_norm(v[0], v[1], v[2], {}, 1e-6);
             return std::vector{h, y};
           },
           "add_rms_norm D " + std::to_string(D));
    }
    // Rows the 16-byte vectors cannot take (42 columns: element by element),
    // and the bias's column sums beside the weight's (shared memory, D 768).
    both({randn({5, 7, 42}), randn({42}) + 1},
         [&](const auto& v) { return std::vector{ops::rms_norm(v[0], v[1], {}, 1e-6)}; }, "rms_norm 42 columns");
    both({randn({4100, 768}), randn({768}) + 1, randn({768})},
         [&](const auto& v) { return std::vector{ops::rms_norm(v[0], v[1], v[2], 1e-6)}; }, "rms_norm bias D 768");
    // The head: losses and gradients of the chunked GEMM + cross-entropy (the
    // row kernel inside), chunks not dividing the rows; an odd vocabulary
    // (element by element) and one of 16-byte vectors, several a thread.
    const at::Tensor t = at::randint(0, 301, {37}, gen, at::kLong);
    both({randn({37, 24}), randn({301, 24})},
         [&](const auto& v) { return std::vector{chunked_cross_entropy(v[0], v[1], t.to(v[0].device()), 8)}; },
         "chunked_cross_entropy");
    const at::Tensor t2 = at::randint(0, 16384, {40}, gen, at::kLong);
    both({randn({40, 24}), randn({16384, 24})},
         [&](const auto& v) { return std::vector{chunked_cross_entropy(v[0], v[1], t2.to(v[0].device()), 16)}; },
         "chunked_cross_entropy 16384 columns");
    // Vocabulary shard statistics and gradient (not differentiable ops).
    const at::Tensor z = randn({11, 40}).to(dt), tz = at::randint(-1, 45, {11}, gen, at::kLong);
    const at::Tensor st = ops::softmax_stats(z, tz, 33), stg = ops::softmax_stats(z.to(cuda), tz.to(cuda), 33);
    expect_close(stg, st, tol, "softmax_stats" + tag);
    const at::Tensor lse = st[0] + st[1].log();
    at::Tensor zc = z.clone(), zg = z.to(cuda);
    ops::softmax_grad_(zc, tz, lse, 33);
    ops::softmax_grad_(zg, tz.to(cuda), lse.to(cuda), 33);
    expect_close(zg, zc, tol, "softmax_grad_" + tag);
    // The experts' grouped GEMM (a 2-D x 3-D _grouped_mm with offsets).
    const at::Tensor offs = at::tensor(std::vector<int32_t>{5, 5, 12, 20});
    both({randn({20, 32}), randn({4, 32, 48})},
         [&](const auto& v) { return std::vector{at::_grouped_mm(v[0], v[1], offs.to(v[0].device()))}; },
         "_grouped_mm");
    // The MoE dispatch and combine (ops/slot_rows.h), three assignments
    // dropped, rows by vectors (d 64) and element by element (d 6).
    const at::Tensor slot = at::tensor(std::vector<int64_t>{4, 9, -1, 0, 7, 2, -1, -1, 11, 5, 1, 3}).view({6, 2});
    for (int64_t d : {64, 6})
      both({randn({6, d}), randn({12, d}), randn({6, 2})},
           [&](const auto& v) {
             const ops::SlotMap m = ops::slot_map(slot.to(v[0].device()), 12);
             return std::vector{ops::slots_from_tokens(v[0], m), ops::tokens_from_slots(v[1], v[2].to(at::kFloat), m)};
           },
           "slot rows d " + std::to_string(d));
    // The GELU MLP (model/gelu_matmul.h): cuBLASLt's epilogues where it takes
    // the shapes (aligned), the composite where it may not (30 features).
    MixedPrecision fp32;
    for (int64_t n : {128, 30}) {
      both({randn({2, 50, 64}), randn({n, 64}), randn({24, n})},
           [&](const auto& v) {
             return std::vector{gelu_linear(linear_gelu(v[0], v[1], {}, fp32), v[2], {}, {}, fp32)};
           },
           "gelu mlp hidden " + std::to_string(n));
      both({randn({4, 40, 64}), randn({4, n, 64}), randn({4, n}), randn({4, 32, n})},
           [&](const auto& v) {
             return std::vector{gelu_linear(linear_gelu(v[0], v[1], v[2], fp32), v[3], {}, {}, fp32)};
           },
           "batched gelu mlp hidden " + std::to_string(n));
    }
  }
}

// The RMSNorm backward at widths whose column sums need more shared memory
// than a block gets by default (12288 without a bias, 6144 with: the launch
// used to fail), and wider than any shared memory (global partial sums),
// bf16 against the CPU kernel (ops/launch_plan.h decides where the sums go).
TEST(Cuda, RmsNormBackwardAtWideRows) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Device cuda(at::kCUDA, 0);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  for (const auto& [D, bias] : {std::pair<int64_t, bool>{12288, false}, {12288, true}, {6144, true},
                                {6144, false}, {65536, true}}) {
    const std::string what = "D " + std::to_string(D) + (bias ? " with bias" : "");
    const at::Tensor x = at::randn({64, D}, gen, f32).to(at::kBFloat16), w = at::randn({D}, gen, f32) + 1;
    const at::Tensor b = bias ? at::randn({D}, gen, f32) : at::Tensor(), g = at::randn({64, D}, gen, f32);
    auto run = [&](const at::Device& dev) {
      const at::Tensor xd = x.to(dev).requires_grad_(true), wd = w.to(dev).requires_grad_(true);
      const at::Tensor bd = bias ? b.to(dev).requires_grad_(true) : at::Tensor();
      const at::Tensor y = ops::rms_norm(xd, wd, bd, 1e-6);
      (y.to(at::kFloat) * g.to(dev)).sum().backward();
      return std::vector<at::Tensor>{y, xd.grad(), wd.grad(), bias ? bd.grad() : at::zeros({1})};
    };
    const auto want = run(at::kCPU), got = run(cuda);
    const char* names[] = {"y", "dx", "dw", "db"};
    for (size_t i = 0; i < want.size(); ++i) expect_close(got[i], want[i], 2e-2, what + " " + names[i]);
  }
}

// cuBLASLt itself (not the composite) runs the GELU GEMMs at the training
// shapes, bf16: GPT-2's MLP (8192 tokens, 768 -> 3072) and moe1B's experts
// (16 experts of 1536 slots, 768 -> 3072, with biases), and its results are
// the CPU's (the same fp32 sums, GELU of the unrounded sum).
TEST(Cuda, CublasLtRunsTheGeluGemms) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
#ifdef MESHTRAIN_CUDA  // (a CPU build has no cuBLASLt path; the test skipped above)
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Device cuda(at::kCUDA, 0);
  auto randn = [&](at::IntArrayRef shape) {
    return (at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * 0.1).to(at::kBFloat16);
  };
  for (const bool batched : {false, true}) {
    const std::string what = batched ? "experts" : "dense";
    const std::vector<int64_t> lead = batched ? std::vector<int64_t>{16} : std::vector<int64_t>{};
    auto shape = [&](std::vector<int64_t> s) {
      s.insert(s.begin(), lead.begin(), lead.end());
      return s;
    };
    const int64_t M = batched ? 1536 : 8192;
    const at::Tensor x = randn(shape({M, 768})), w = randn(shape({3072, 768})), w2 = randn(shape({768, 3072}));
    const std::optional<at::Tensor> b = batched ? std::optional<at::Tensor>(randn(shape({3072}))) : std::nullopt;
    const at::Tensor dy = randn(shape({M, 768}));
    at::Tensor pre = at::empty(shape({M, 3072}), x.options().device(cuda)), h = at::empty_like(pre);
    const auto bg = b ? std::optional<at::Tensor>(b->to(cuda)) : std::nullopt;
    const char* declined = ops::impl::lt_linear_gelu(x.to(cuda), w.to(cuda), bg, pre, h);
    ASSERT_EQ(declined, nullptr) << what << ": cuBLASLt declined GELU_AUX: " << declined;
    auto [pre_c, h_c] = ops::linear_gelu(x, w, b);
    expect_close(pre, pre_c, 1e-2, what + " pre");
    expect_close(h, h_c, 1e-2, what + " gelu");
    at::Tensor dpre = at::empty_like(pre);
    const char* declined_d = ops::impl::lt_linear_dgelu(dy.to(cuda), w2.to(cuda), pre, dpre);
    ASSERT_EQ(declined_d, nullptr) << what << ": cuBLASLt declined DGELU: " << declined_d;
    expect_close(dpre, ops::linear_dgelu(dy, w2, pre_c), 2e-2, what + " dgelu");
  }
#endif
}

// meshtrain::adamw_ on CUDA against its CPU kernel: 40 small tensors (more
// than one launch's table holds) and one of 21.2M elements (more chunks than
// one launch's blocks: its chunks carry over into the next launch), three
// steps with clipping, then a step skipped by found_inf. The GPU run also
// writes the weights' bf16 casts: they must be Tensor::to's casts of its
// weights, bit for bit (the kept casts of model/mixed_precision.h).
TEST(Cuda, AdamwKernelMatchesItsCpuKernel) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  const at::Device cuda(at::kCUDA, 0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  for (at::ScalarType dt : {at::kBFloat16, at::kFloat}) {
    const std::string tag = dt == at::kFloat ? " fp32 moments" : " bf16 moments";
    std::vector<at::Tensor> p, g, m, v;
    std::vector<int64_t> sizes;
    for (int64_t k = 0; k < 40; ++k) sizes.push_back(1 + 997 * k);
    sizes.push_back(int64_t{65536} * 323 + 5);
    for (int64_t n : sizes) {
      p.push_back(at::randn({n}, gen, f32));
      g.push_back(at::randn({n}, gen, f32) * 0.1);
      m.push_back((at::randn({n}, gen, f32) * 0.01).to(dt));
      v.push_back((at::randn({n}, gen, f32).abs() * 1e-3).to(dt));
    }
    const auto on_gpu = [&](const std::vector<at::Tensor>& ts) {
      std::vector<at::Tensor> out;
      for (const auto& t : ts) out.push_back(t.to(cuda));
      return out;
    };
    std::vector<at::Tensor> pg = on_gpu(p), gg = on_gpu(g), mg = on_gpu(m), vg = on_gpu(v), cg;
    for (const auto& t : pg) cg.push_back(at::zeros(t.sizes(), t.options().dtype(at::kBFloat16)));
    const ops::AdamwHyper h{1e-3, 0.9, 0.95, 0.1, 1e-8};
    const at::Tensor scale = at::full({}, 1.7f, f32);
    for (int t = 1; t <= 4; ++t) {
      const at::Tensor step = at::full({}, static_cast<float>(t), f32);
      const at::Tensor inf = at::full({}, t == 4 ? 1.0f : 0.0f, f32);
      ops::adamw_(p, g, m, v, step, h, scale, inf);
      ops::adamw_(pg, gg, mg, vg, step.to(cuda), h, scale.to(cuda), inf.to(cuda), cg);
    }
    int64_t differ = 0, total = 0;
    for (size_t k = 0; k < p.size(); ++k) {
      const std::string what = "tensor " + std::to_string(k) + tag;
      // nvcc fuses multiply-adds the CPU compiler does not: round-off apart
      // (an H200 measured 1.8e-6 of the largest parameter: a few fp32 ulps of
      // its update; a wrong update is off by lr, 1e-3).
      expect_close(pg[k], p[k], 1e-5, what + " param");
      expect_close(mg[k], m[k], dt == at::kFloat ? 1e-5 : 1.0 / 128, what + " exp_avg");
      expect_close(vg[k], v[k], dt == at::kFloat ? 1e-5 : 1.0 / 128, what + " exp_avg_sq");
      EXPECT_TRUE(at::equal(gg[k].cpu(), g[k])) << what << ": the gradient was written";
      EXPECT_TRUE(at::equal(cg[k], pg[k].to(at::kBFloat16))) << what << ": the cast is not the weight's";
      differ += mg[k].cpu().ne(m[k]).sum().item<int64_t>() + vg[k].cpu().ne(v[k]).sum().item<int64_t>();
      total += 2 * m[k].numel();
    }
    std::printf("adamw_%s: %lld of %lld moments differ between CUDA and CPU\n", tag.c_str(),
                static_cast<long long>(differ), static_cast<long long>(total));
    if (dt == at::kBFloat16) EXPECT_LE(differ, total / 1000);
  }
}

TEST(Cuda, Bf16GpuLossesMatchFp32Cpu) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  const Config dense = test::tiny_config(test::synthetic_data(kData, 96), "bf16");
  for (const Config& base : {dense, test::moe_mla(dense)}) {
    const std::string kind = base.model.ffn == FfnKind::Moe ? "moe+mla" : "dense";
    Config cpu = base;
    cpu.name = "bf16-cpu-" + kind;
    cpu.training_steps = 3;
    cpu.model.model_dtype = ModelDtype::Float32;
    Config gpu = on_gpu(cpu, "auto");
    gpu.name = "bf16-gpu-" + kind;
    gpu.model.model_dtype = ModelDtype::Bfloat16;
    const auto ref = run(cpu, true), got = run(gpu, true);
    ASSERT_EQ(ref.size(), got.size()) << kind;
    // Same weights (drawn on the CPU by name) and batches: only bf16 rounding
    // (8-bit mantissa, ~0.4% per op) separates the curves.
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_NEAR(got[i], ref[i], 3e-2 * ref[i]) << kind << ": loss of step " << i;
  }
}

// Packed documents and context-parallel chunks on CUDA in bf16 run flash's
// varlen kernel (model/token_layout.h): its outputs and q/k/v gradients
// equal the masked fp32 attention on the CPU within bf16 rounding, with
// values narrower than the heads (MLA) as well.
TEST(Cuda, VarlenAttentionMatchesTheMaskOnCpu) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  const int64_t B = 2, H = 4, T = 64;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  at::Tensor tokens = at::randint(1, 50, {B, T}, gen, at::kLong);
  for (int64_t t : {5, 17, 18, 40}) tokens[0][t] = 0;  // documents of 6, 12, 1, 22 and 23 tokens
  tokens[1][63] = 0;
  for (int64_t cp : {1, 2}) {
    for (int64_t dv : {64, 48}) {
      const int64_t D = 64, Tl = T / cp, rank = cp - 1;
      const TokenLayout cpu = make_token_layout(tokens, 0, rank, cp, at::kCPU);
      const TokenLayout gpu = make_token_layout(tokens, 0, rank, cp, at::Device(at::kCUDA), /*varlen=*/true);
      const at::Tensor q = at::randn({B, H, Tl, D}, gen), k = at::randn({B, H, T, D}, gen),
                       v = at::randn({B, H, T, dv}, gen), dy = at::randn({B, H, Tl, dv}, gen);
      auto grads = [&](const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const TokenLayout& L) {
        const at::Tensor a = q0.detach().requires_grad_(true), b = k0.detach().requires_grad_(true),
                         c = v0.detach().requires_grad_(true);
        const at::Tensor y = layout_attention(a, b, c, 0.0, L);
        y.backward(dy.to(y.device(), y.scalar_type()));
        const auto host = [](const at::Tensor& t) { return t.detach().to(at::kFloat).cpu(); };
        return std::vector<at::Tensor>{host(y), host(a.grad()), host(b.grad()), host(c.grad())};
      };
      const auto want = grads(q, k, v, cpu);
      const auto bf = [](const at::Tensor& t) { return t.to(at::kCUDA, at::kBFloat16); };
      const auto got = grads(bf(q), bf(k), bf(v), gpu);
      const char* names[] = {"output", "dq", "dk", "dv"};
      for (size_t i = 0; i < want.size(); ++i) {
        const double err = (got[i] - want[i]).abs().max().item<double>();
        const double scale = want[i].abs().max().item<double>();
        EXPECT_LT(err, 3e-2 * scale) << names[i] << ", cp " << cp << ", value width " << dv << ": max error " << err
                                     << " of " << scale;
      }
    }
  }
}

// MLA's values padded only as far as the kernel torch picks at the full
// width needs (model/attention.h): the width this GPU gets, and the same
// outputs and gradients as v padded all the way (fp32 on the CPU as the
// reference for both).
TEST(Cuda, MlaValuesPaddedOnlyAsFarAsTheKernelNeeds) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  const int64_t B = 2, H = 4, T = 256, D = 192, hd = 64;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  const at::Tensor q = at::randn({B, H, T, D}, gen), k = at::randn({B, H, T, D}, gen),
                   v = at::randn({B, H, T, hd}, gen), dy = at::randn({B, H, T, hd}, gen);
  const auto bf = [](const at::Tensor& t) { return t.to(at::kCUDA, at::kBFloat16).requires_grad_(true); };
  const int64_t width = value_width_for(bf(q), bf(k), bf(v), 0.0);
  std::cout << "MLA values on this GPU: " << width << " of " << D << " columns ("
            << attention_backend_for(bf(q), bf(k), bf(at::zeros({B, H, T, width}))) << ")" << std::endl;
  EXPECT_GE(width, hd);
  EXPECT_LE(width, D);
  auto grads = [&](const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, int64_t w) {
    const at::Tensor a = q0.detach().requires_grad_(true), b = k0.detach().requires_grad_(true),
                     c = v0.detach().requires_grad_(true);
    const at::Tensor y = w > 0 ? causal_attention_padded_v(a, b, c, 0.0, w) : causal_attention(a, b, c, 0.0);
    y.backward(dy.to(y.device(), y.scalar_type()));
    const auto host = [](const at::Tensor& t) { return t.detach().to(at::kFloat).cpu(); };
    return std::vector<at::Tensor>{host(y), host(a.grad()), host(b.grad()), host(c.grad())};
  };
  const auto want = grads(q, k, v, 0);
  for (int64_t w : {width, D}) {
    const auto got = grads(bf(q), bf(k), bf(v), w);
    const char* names[] = {"output", "dq", "dk", "dv"};
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = (got[i] - want[i]).abs().max().item<double>();
      const double scale = want[i].abs().max().item<double>();
      EXPECT_LT(err, 3e-2 * scale) << names[i] << ", value width " << w << ": max error " << err << " of " << scale;
    }
  }
}

// {(2,1,1), (1,2,1), (1,1,2)} under -np 2 and (2,2,2) under -np 8, all ranks
// on one GPU with staged MPI collectives, against one GPU process (fp32).
TEST(Cuda, MeshesWithMpiCollectivesMatchOneGpuProcess) {
  SKIP_WITHOUT_CUDA();
  const int n = test_runtime().size();
  std::vector<std::array<int, 3>> meshes;
  if (n == 2) meshes = {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}};
  if (n == 8) meshes = {{2, 2, 2}};
  if (meshes.empty()) GTEST_SKIP() << "runs under mpirun -np 2 and -np 8 (this run has " << n << " ranks)";
  const Config dense = on_gpu(test::tiny_config(test::synthetic_data(kData, 96), "cuda-mesh"), "mpi");
  for (const Config& base : {dense, test::moe_mla(dense)}) {
    Config cfg = base;
    cfg.training_steps = 4;
    cfg.data.micro_batch_size = 2;  // pp > 1 runs several microbatches
    const std::string kind = base.model.ffn == FfnKind::Moe ? "moe+mla" : "dense";
    cfg.name = "cuda-mesh-" + kind;
    const auto ref = test::single_process_losses(cfg);
    for (const auto& m : meshes) {
      const std::string what = kind + " on (" + std::to_string(m[0]) + "," + std::to_string(m[1]) + "," +
                               std::to_string(m[2]) + ")";
      Config c = test::with_mesh(cfg, m[0], m[1], m[2]);
      c.name = cfg.name + "-" + std::to_string(m[0]) + std::to_string(m[1]) + std::to_string(m[2]);
      test::expect_same_curve(ref, test::train_losses(c), 1e-4, what);
    }
  }
}

TEST(Cuda, NcclCollectivesOnOneRank) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  const at::Device dev = use_cuda_device(0);
  EXPECT_FALSE(nccl_runtime_version().empty());
  auto world = test_runtime().world();
  Mesh mesh(*world, MeshShape{1, 1, 1}, Backend::Nccl);
  ASSERT_EQ(mesh.backend(), "nccl");
  Communicator& c = mesh.dp();
  const at::Tensor x = at::arange(12, at::TensorOptions().dtype(at::kFloat).device(dev)).reshape({3, 4});
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    at::Tensor t = x.to(dtype);
    c.all_reduce(t);
    EXPECT_EQ(t.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(t.cpu(), x.to(dtype).cpu()));
    EXPECT_TRUE(at::equal(c.reduce_scatter(x.to(dtype), 1).cpu(), x.to(dtype).cpu()));
  }
  EXPECT_TRUE(at::equal(c.all_gather(x, 1).cpu(), x.cpu()));
  EXPECT_TRUE(at::equal(c.all_to_all(x).cpu(), x.cpu()));
  at::Tensor b = x.clone();
  c.broadcast(b, 0);
  EXPECT_TRUE(at::equal(b.cpu(), x.cpu()));
  c.barrier();
  EXPECT_GT(mesh.bytes_moved(), 0);
  // CPU tensors are refused with the reason, not handed to NCCL.
  at::Tensor host = x.cpu();
  EXPECT_THROW(c.all_reduce(host), Error);
}

TEST(Cuda, StagedMpiCollectivesOnCudaTensors) {
  SKIP_WITHOUT_CUDA();
  auto world = test_runtime().world();
  const int p = world->size(), r = world->rank();
  const at::Device dev = use_cuda_device(0);
  Mesh mesh(*world, MeshShape{p, 1, 1}, Backend::Mpi);
  Communicator& c = mesh.dp();
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(dev);
  const at::Tensor base = at::arange(4 * p, opts).reshape({2 * p, 2});
  at::Tensor t = base * (r + 1);
  c.all_reduce(t);
  EXPECT_TRUE(t.is_cuda());
  EXPECT_TRUE(at::allclose(t.cpu(), (base * tri(p)).cpu()));
  EXPECT_EQ(c.bytes_moved(), static_cast<int64_t>(t.nbytes()));
  const at::Tensor g = c.all_gather(at::full({1}, r, opts), 0);
  EXPECT_TRUE(g.is_cuda());
  EXPECT_TRUE(at::equal(g.cpu(), at::arange(p, at::kFloat)));
  const at::Tensor rs = c.reduce_scatter(base, 0);
  EXPECT_TRUE(rs.is_cuda());
  EXPECT_TRUE(at::allclose(rs.cpu(), (base.narrow(0, 2 * r, 2) * p).cpu()));
  at::Tensor b = at::full({3}, r == 0 ? 7.0 : 0.0, opts.dtype(at::kBFloat16));
  c.broadcast(b, 0);
  EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(b.cpu(), at::full({3}, 7.0, at::kBFloat16)));
  const at::Tensor a2a = c.all_to_all(at::full({p}, r, opts));
  EXPECT_TRUE(at::equal(a2a.cpu(), at::arange(p, at::kFloat)));
  if (p > 1) {
    // A ring of send/recv on strided (non-contiguous) CUDA views.
    const at::Tensor out = at::full({2, 3}, r, opts).t();
    at::Tensor in = at::zeros({2, 3}, opts).t();
    if (r % 2 == 0) {
      c.send(out, (r + 1) % p, 5);
      c.recv(in, (r + p - 1) % p, 5);
    } else {
      c.recv(in, (r + p - 1) % p, 5);
      c.send(out, (r + 1) % p, 5);
    }
    EXPECT_TRUE(at::equal(in.cpu(), at::full({3, 2}, (r + p - 1) % p, at::kFloat)));
  }
  c.barrier();
}

TEST(Cuda, CheckpointFromCudaLoadsOnCpuAndBack) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  Config gpu = on_gpu(test::tiny_config(test::synthetic_data(kData, 96), "cuda-ckpt"), "auto");
  gpu.training_steps = 2;
  gpu.checkpoint_steps = 2;
  SessionOptions fresh;
  fresh.fresh = true;
  fresh.quiet = true;
  Trainer a(gpu, test_runtime(), fresh);
  a.train();
  const auto saved = params_of(a);
  const auto dir = find_latest_checkpoint(gpu.run_dir());
  ASSERT_TRUE(dir.has_value());

  Config cpu = gpu;
  cpu.device.device = DeviceChoice::Cpu;
  SessionOptions load;
  load.quiet = true;
  load.checkpoint = *dir;
  Trainer b(cpu, test_runtime(), load);
  EXPECT_FALSE(b.model().params.front().tensor.is_cuda());
  expect_same_params(saved, params_of(b), "CUDA checkpoint loaded on CPU");
  b.save_checkpoint();  // the same step, now written from CPU tensors

  Trainer c(gpu, test_runtime(), load);
  EXPECT_TRUE(c.model().params.front().tensor.is_cuda());
  expect_same_params(saved, params_of(c), "CPU re-save loaded back on CUDA");
  EXPECT_EQ(c.step(), 2);
}

TEST(Cuda, ResumeOnGpuIsExactWithDropout) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  Config cfg = on_gpu(test::tiny_config(test::synthetic_data(kData, 96), "cuda-resume"), "auto");
  cfg.model.dropout_rate = 0.1;
  cfg.training_steps = 6;
  cfg.checkpoint_steps = 3;
  const auto straight = run(cfg, true);
  Config part = cfg;
  part.name = "cuda-resume-split";
  part.training_steps = 3;
  run(part, true);
  part.training_steps = 6;
  const auto resumed = run(part, false);
  ASSERT_EQ(straight.size(), 6u);
  ASSERT_EQ(resumed.size(), 3u);
  // Dropout masks come from the CUDA generator: without its saved state the
  // resumed steps draw other masks and the losses move by ~1e-2. 1e-6 leaves
  // room only for non-deterministic reductions of CUDA kernels.
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(resumed[i], straight[3 + i], 1e-6) << "step " << 4 + i << " after resume";
}

// Reading step N's statistics waits for step N only: with step N+1 made
// long on the device (a ~1 s sleep kernel, then the sums overwritten as the
// next step would), read() returns before N+1 ends and gives N's values
// (issue 45: the read's copy was queued behind all of N+1, so the host
// waited for N+1 and the GPU then idled while the host issued N+2).
TEST(Cuda, StepStatsReadWaitsForItsOwnStepOnly) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
#ifdef MESHTRAIN_CUDA
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA, 0);
  StepStats st;
  st.sums.ce = at::full({1}, 24.0, f64);
  st.sums.aux = at::zeros({1}, f64);
  st.sums.z = at::zeros({1}, f64);
  st.sums.dropped = at::zeros({1}, f64);
  st.sums.assigned = at::zeros({1}, f64);
  st.sums.expert_tokens = at::zeros({0, 0}, f64);
  st.sums.mtp = at::zeros({0}, f64);  // no multi-token prediction depth
  st.grad_norm_t = at::full({}, 0.5, f64);
  st.tokens = 8;
  st.seq_len = 4;
  st.start_read();
  int khz = 0;  // the SM clock (cudaDeviceProp lost clockRate in CUDA 13)
  ASSERT_EQ(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0), cudaSuccess);
  const int64_t cycles_per_second = int64_t{1000} * khz;
  at::cuda::sleep(cycles_per_second);  // step N+1, about a second
  for (at::Tensor* f : st.sums.fields()) f->fill_(-7.0);
  st.grad_norm_t.fill_(99.0);
  c10::Event next(at::kCUDA);
  next.record(c10::cuda::getCurrentCUDAStream());
  st.read();
  EXPECT_FALSE(next.query()) << "reading step N waited for step N+1 to finish";
  EXPECT_DOUBLE_EQ(st.loss, 3.0);
  EXPECT_DOUBLE_EQ(st.grad_norm, 0.5);
  next.synchronize();
#endif
}

// device_config.cuda_graphs on a GPU (train/step_graph.h): steps 1-3 eager
// (2 and 3 checked), step 4 captured and replayed, every later step a
// replay; the losses and gradient norms are the eager run's: fp32 dense,
// fp32 MoE + MLA with capacity and dropout (the graph's Philox offsets give
// the eager masks), bf16 dense with grad_step 2 and bf16 moments.
TEST(Cuda, GraphedStepsMatchEagerSteps) {
  SKIP_WITHOUT_CUDA();
  SKIP_UNLESS_RANKS(1);
  Config dense = on_gpu(test::tiny_config(test::synthetic_data(kData, 96), "cuda-graphs"), "auto");
  dense.training_steps = 8;
  Config moe = test::moe_mla(dense);
  moe.name = "cuda-graphs-moe";
  moe.model.dropout_rate = 0.1;
  Config bf16 = dense;
  bf16.name = "cuda-graphs-bf16";
  bf16.model.model_dtype = ModelDtype::Bfloat16;
  bf16.optimizer_state_dtype = ModelDtype::Bfloat16;
  bf16.grad_step = 2;
  for (Config c : {dense, moe, bf16}) {
    const double tol = c.model.model_dtype == ModelDtype::Bfloat16 ? 2e-3 : 1e-5;
    const auto eager = run(c, true);
    c.name += "-graphs";
    c.device.cuda_graphs = true;
    SessionOptions o;
    o.fresh = true;
    o.quiet = true;
    Trainer t(c, test_runtime(), o);
    t.train();
    ASSERT_NE(t.step_graph(), nullptr) << c.name;
    EXPECT_EQ(t.step_graph()->last_mode(), "replayed") << c.name;
    test::expect_same_curve(eager, test::curve_of(t), tol, c.name);
  }
}

}  // namespace
