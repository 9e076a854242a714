// bf16 mixed precision on CPU ranks: the program a GPU runs (model_dtype
// "bfloat16": fp32 master weights, grads and AdamW; bf16 matmuls,
// attention and activations between layers and stages; fp32 norm/softmax
// statistics and router), checked where every test can run it.
//
// The matrix: every mesh kind -- dp (gradient buckets), tp, tp + sequence
// parallelism, pp 1F1B and interleaved, expert parallelism by capacity slots
// and dropless, zero_stage 1/2/3 with several microbatches per rank,
// activation recomputation full and selective, (2,2,2) -- gives the losses
// and gradient norms of one bf16 process, dense and MoE + MLA
// (configs/tiny.json, configs/tiny-moe-mla.json at the tests' size), and one
// bf16 process stays within bf16 tolerance of fp32. The mesh runs marked
// `thread` run every backward pass on a thread of its own, as CUDA's autograd
// engine does (SessionOptions::backward_thread): recomputation, FSDP, the dp
// buckets' hooks and the expert all-to-all's backward all run there.
//
// Tolerances, relative to the value compared. bf16 keeps 8 significant
// bits: rounding to nearest moves a value by at most u = 2^-8 of itself, and
// two roundings of one sum grouped otherwise may land on neighbouring bf16
// values, 2u (one ulp) apart. A mesh computes exactly such sums: a tp rank's
// partial GEMM rounded to bf16 before the all-reduce adds the other's, a GEMM
// over a microbatch instead of the whole batch, gradients reduced over dp in
// another order. The loss (a mean over every token) and the gradient norm (a
// root of a sum of squares over every element) aggregate many such
// independently rounded terms, whose roundings cancel rather than add, so
// the two runs may differ by one ulp of the aggregate, not by one per term:
//   mesh vs one bf16 process:  kMesh = 2u = 2^-7 (0.78%)
// over the 3 steps compared (AdamW's first updates are about lr * sign(g) per
// element, so a rounding that flips a tiny gradient's sign moves its weight
// by at most 2 lr: the next steps' differences stay of the same order).
// Measured worst (the test prints every case's): 2.1e-3 = 0.55u (tiny-
// jaxformer on (2,2,2), zero_stage 3, recompute). What a bug does is far
// larger: issue 27's lost FSDP gradients 11.6% (30u), a lost microbatch of
// two 50%, a wrong dp scale 2x.
// bf16 vs fp32: the bf16 program rounds the operands and the output of every
// matmul, the same weights the same way each time (systematic, not
// independent), so two ulps of the aggregate:
//   one bf16 process vs fp32:  kFp32 = 4u = 2^-6 (1.6%); measured worst 5.6e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/parallel/pipeline_generate.h"
#include "meshtrain/sampling/generate.h"
#include "generate_parity.h"
#include "parity.h"

using namespace meshtrain;

namespace {

constexpr double kU = 1.0 / 256;    // 2^-8: bf16's rounding, relative
constexpr double kMesh = 2 * kU;
constexpr double kFp32 = 4 * kU;

const std::string kData = test::scratch_dir("bf16-data");

// configs/<file>'s model (float32 there) at the tests' T and vocabulary, in bf16.
Config from_file(Config c, const std::string& file) {
  ModelConfig m = load_config(std::string(MT_SOURCE_DIR) + "/configs/" + file).config.model;
  m.T = c.model.T;
  m.vocab_size = c.model.vocab_size;
  m.dropout_rate = 0.0;
  m.model_dtype = ModelDtype::Bfloat16;
  c.model = m;
  c.alpha = 0.01;
  return c;
}

Config base(const std::string& name) {
  Config c = test::tiny_config(test::synthetic_data(kData, 96), name + "-np" + std::to_string(test_runtime().size()));
  c.training_steps = 3;
  c.eval_steps = 0;
  c.grad_clip_norm = 1.0;
  c.inference.max_tokens = 0;
  return c;
}

Config dense(const std::string& name) { return from_file(base(name), "tiny.json"); }
Config moe(const std::string& name) { return from_file(base(name), "tiny-moe-mla.json"); }
Config dropless(const std::string& name) {
  Config c = moe(name);
  c.model.capacity_factor = 0;
  return c;
}

// Relative: |got - ref| <= tol * |ref| for every loss and gradient norm.
void expect_within(const test::Curve& ref, const test::Curve& got, double tol, const std::string& what,
                   double* worst = nullptr) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  ASSERT_EQ(ref.grad_norms.size(), got.grad_norms.size()) << what;
  double w = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(ref[i], got[i], tol * std::abs(ref[i])) << what << ": loss of step " << i + 1;
    EXPECT_NEAR(ref.grad_norms[i], got.grad_norms[i], tol * std::abs(ref.grad_norms[i]))
        << what << ": grad norm of step " << i + 1;
    w = std::max({w, std::abs(ref[i] - got[i]) / std::abs(ref[i]),
                  std::abs(ref.grad_norms[i] - got.grad_norms[i]) / std::abs(ref.grad_norms[i])});
  }
  if (worst) *worst = w;
}

struct Case {
  std::string name;
  int dp = 1, pp = 1, tp = 1, ep = 1;
  bool sp = false;
  std::string schedule = "1f1b";
  int zero = 0;
  std::string recompute = "none";
  int64_t micro = 0;     // micro_batch_size (0: the rank's whole share)
  bool thread = false;   // backward on another thread
  bool moe_only = false;
  bool keep = false;     // fsdp_keep_gathered
  int cp = 1;            // context_parallel (world = dp * pp * tp * cp)
};

Config on(Config c, const Case& k) {
  c = test::with_mesh(c, k.dp, k.pp, k.tp);
  c.device.expert_parallel = k.ep;
  c.sequence_parallel = k.sp;
  // The cases name their choices as a config file does.
  c.pipeline_schedule = parse_choice<PipelineSchedule>(k.schedule).value();
  if (c.pipeline_schedule == PipelineSchedule::Interleaved) c.virtual_stages = 2;
  c.zero_stage = k.zero;
  c.activation_checkpointing = parse_choice<ActivationCheckpointing>(k.recompute).value();
  c.data.micro_batch_size = k.micro;
  c.fsdp_keep_gathered = k.keep;
  c.device.context_parallel = k.cp;
  c.name += "-" + k.name;
  return c;
}

// The meshes each -np runs (8 sequences per step: dp 2 and micro 2 is two
// microbatches per rank).
std::vector<Case> cases(int n) {
  if (n == 2)
    return {
        {"dp", 2, 1, 1, 1, false, "1f1b", 0, "none", 0, true},
        {"zero1", 2, 1, 1, 1, false, "1f1b", 1, "none", 2, false},
        {"zero2", 2, 1, 1, 1, false, "1f1b", 2, "none", 2, true},
        {"zero3", 2, 1, 1, 1, false, "1f1b", 3, "none", 2, true},
        {"zero3-full", 2, 1, 1, 1, false, "1f1b", 3, "full", 2, true},
        {"zero3-keep", 2, 1, 1, 1, false, "1f1b", 3, "none", 2, true, false, true},
        {"zero2-keep-full", 2, 1, 1, 1, false, "1f1b", 2, "full", 2, true, false, true},
        {"tp", 1, 1, 2, 1, false, "1f1b", 0, "none", 0, false},
        {"tp-sp", 1, 1, 2, 1, true, "1f1b", 0, "none", 0, false},
        {"tp-selective", 1, 1, 2, 1, false, "1f1b", 0, "selective", 0, true},
        {"pp-1f1b", 1, 2, 1, 1, false, "1f1b", 0, "none", 2, false},
        {"pp-interleaved", 1, 2, 1, 1, false, "interleaved", 0, "full", 2, true},
        {"ep", 2, 1, 1, 2, false, "1f1b", 0, "none", 2, true, true},
        {"cp2", 1, 1, 1, 1, false, "1f1b", 0, "none", 0, true, false, false, 2},
    };
  if (n == 4)
    return {
        {"dp-tp-sp-zero3", 2, 1, 2, 1, true, "1f1b", 3, "full", 2, true},
        {"dp-pp-zero2", 2, 2, 1, 1, false, "1f1b", 2, "none", 1, true},
        {"ep4-zero3", 4, 1, 1, 2, false, "1f1b", 3, "selective", 1, true, true},
        {"dp-pp-zero3-keep", 2, 2, 1, 1, false, "1f1b", 3, "full", 1, true, false, true},
        {"cp2-tp2-sp-zero1", 1, 1, 2, 1, true, "1f1b", 1, "full", 0, true, false, false, 2},
    };
  if (n == 8)
    return {
        {"222", 2, 2, 2, 1, false, "1f1b", 0, "none", 1, false},
        {"222-sp-zero3-full", 2, 2, 2, 1, true, "1f1b", 3, "full", 1, true},
    };
  return {};
}

void expect_meshes_match_one_process(const Config& model) {
  const int n = test_runtime().size();
  if (cases(n).empty()) GTEST_SKIP() << "no bf16 mesh for -np " << n;
  const test::Curve ref = test::single_process_losses(model);
  for (const Case& k : cases(n)) {
    if (k.moe_only && model.model.ffn != FfnKind::Moe) continue;
    SCOPED_TRACE(choice_name(model.model.ffn) + std::string(" capacity_factor ") +
                 std::to_string(model.model.capacity_factor) + " on " + k.name);
    double worst = 0;
    expect_within(ref, test::train_losses(on(model, k), k.thread), kMesh, k.name, &worst);
    if (test_runtime().rank() == 0)
      std::printf("bf16 %s cf %.2f %-20s worst relative difference from one bf16 process %.2e (tolerance %.2e)\n",
                  choice_name(model.model.ffn), model.model.capacity_factor, k.name.c_str(), worst, kMesh);
  }
}

}  // namespace

// CUDA's autograd engine runs backward on its device thread, and with it the
// recomputed forward of activation checkpointing: that forward must compute
// in bf16 as the first one did (the policy travels with the model, not with
// the forward's thread). Same ops in the same order: bitwise equal.
TEST(Bf16, RecomputationOnTheBackwardThread) {
  if (test_runtime().size() != 1) GTEST_SKIP() << "one process (-np 1)";
  for (ActivationCheckpointing mode : {ActivationCheckpointing::Full, ActivationCheckpointing::Selective}) {
    for (Config c : {dense("recompute-thread"), moe("recompute-thread-moe")}) {
      c.activation_checkpointing = mode;
      c.name += std::string("-") + choice_name(mode);
      SCOPED_TRACE(choice_name(c.model.ffn) + std::string(" activation_checkpointing ") + choice_name(mode));
      const test::Curve here = test::single_process_losses(c);
      const test::Curve there = test::single_process_losses(c, /*backward_thread=*/true);
      ASSERT_EQ(here.size(), there.size());
      for (size_t i = 0; i < here.size(); ++i) {
        EXPECT_EQ(here[i], there[i]) << "loss of step " << i + 1;
        EXPECT_EQ(here.grad_norms[i], there.grad_norms[i]) << "grad norm of step " << i + 1;
      }
    }
  }
}

// optimizer_writes_casts (default): the update writes each weight's bf16
// cast, and the next forward reads it instead of casting the fp32 weight.
// Those are the same bits as the casts it replaces, so with bf16 moments
// (meshtrain::adamw_ either way) every loss and gradient norm is equal: a
// cast one update behind, or never written, fails that. With fp32 moments
// the run without it updates through aten's fused AdamW, whose fp32
// round-off differs in the last bits; a weight that lands on the other side
// of a bf16 rounding boundary then reads one bf16 ulp apart, so the runs are
// two differently rounded bf16 programs: within kMesh (measured 2.5e-4).
TEST(Bf16, OptimizerWrittenCastsAreTheCastsOfEachStep) {
  if (test_runtime().size() != 1) GTEST_SKIP() << "one process (-np 1)";
  for (ModelDtype moments : {ModelDtype::Bfloat16, ModelDtype::Float32})
    for (Config c : {dense("written-casts"), moe("written-casts-moe"), dropless("written-casts-dropless")}) {
      c.training_steps = 5;
      c.optimizer_state_dtype = moments;
      c.name += std::string("-") + choice_name(moments);
      Config off = c;
      off.optimizer_writes_casts = false;
      off.name += "-off";
      SCOPED_TRACE(c.name);
      const test::Curve on_curve = test::single_process_losses(c), off_curve = test::single_process_losses(off);
      ASSERT_EQ(on_curve.size(), off_curve.size());
      for (size_t i = 0; i < on_curve.size(); ++i) {
        if (moments == ModelDtype::Bfloat16) {
          EXPECT_EQ(on_curve[i], off_curve[i]) << "loss of step " << i + 1;
          EXPECT_EQ(on_curve.grad_norms[i], off_curve.grad_norms[i]) << "grad norm of step " << i + 1;
        } else {
          EXPECT_NEAR(on_curve[i], off_curve[i], kMesh * std::abs(off_curve[i])) << "loss of step " << i + 1;
          EXPECT_NEAR(on_curve.grad_norms[i], off_curve.grad_norms[i], kMesh * off_curve.grad_norms[i])
              << "grad norm of step " << i + 1;
        }
      }
    }
}

// The policy is the model's: bf16 on CPU is not fp32 (the casts run), and
// stays within bf16's tolerance of it.
TEST(Bf16, OneProcessWithinBf16OfFp32) {
  if (test_runtime().size() != 1) GTEST_SKIP() << "one process (-np 1)";
  for (const Config& b : {dense("vs-fp32"), moe("vs-fp32-moe"), dropless("vs-fp32-dropless")}) {
    Config f = b;
    f.model.model_dtype = ModelDtype::Float32;
    f.name += "-fp32";
    const test::Curve ref = test::single_process_losses(f), got = test::single_process_losses(b);
    double worst = 0;
    expect_within(ref, got, kFp32, choice_name(b.model.ffn) + std::string(" bf16 vs fp32"), &worst);
    std::printf("%s cf %.2f: one bf16 process vs fp32: worst relative difference %.2e (tolerance %.2e)\n",
                choice_name(b.model.ffn), b.model.capacity_factor, worst, kFp32);
    EXPECT_GT(worst, 0.0) << "bf16 computed exactly what fp32 does: the casts did not run";
  }
}

TEST(Bf16, DenseMeshesMatchOneProcess) { expect_meshes_match_one_process(dense("dense")); }
TEST(Bf16, MoeMlaMeshesMatchOneProcess) { expect_meshes_match_one_process(moe("moe")); }
TEST(Bf16, DroplessMoeMeshesMatchOneProcess) { expect_meshes_match_one_process(dropless("dropless")); }

// zero_stage 3 gathers the layers' weights in bf16 (each rank casts its
// slice, then all-gathers); zero_stage 2 keeps them whole in fp32 and the
// layers cast them. The casts are the same bits and each reduce-scatter the
// same sums; only the global norm's fp64 sum runs over other slices (stage 3
// keeps the cast weights in flats of their own), so the runs agree to fp32
// round-off, 1e-6 -- far inside bf16's 2^-7, which any wrong cast would
// cross (with and without fsdp_keep_gathered, with recomputation reading the
// gathered weights again).
TEST(Bf16, Zero3Bf16GathersEqualZero2Casts) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "dp 2 needs -np 2";
  for (const Config& b : {dense("gather-bits"), dropless("gather-bits-moe")})
    for (bool keep : {false, true})
      for (const char* recompute : {"none", "full"}) {
        Case k{"", 2, 1, 1, 1, false, "1f1b", 2, recompute, 2, true, false, keep};
        k.name = std::string("z2-") + recompute + (keep ? "-keep" : "");
        const test::Curve two = test::train_losses(on(b, k), true);
        k.zero = 3;
        k.name[1] = '3';
        const test::Curve three = test::train_losses(on(b, k), true);
        SCOPED_TRACE(choice_name(b.model.ffn) + std::string(" ") + k.name);
        ASSERT_EQ(two.size(), three.size());
        double worst = 0;
        for (size_t i = 0; i < two.size(); ++i) {
          EXPECT_NEAR(two[i], three[i], 1e-6 * std::abs(two[i])) << "loss of step " << i + 1;
          EXPECT_NEAR(two.grad_norms[i], three.grad_norms[i], 1e-6 * two.grad_norms[i]) << "grad norm of step " << i + 1;
          worst = std::max({worst, std::abs(two[i] - three[i]) / std::abs(two[i]),
                            std::abs(two.grad_norms[i] - three.grad_norms[i]) / two.grad_norms[i]});
        }
        if (test_runtime().rank() == 0)
          std::printf("bf16 %s %s: zero_stage 3 (bf16 gathers) vs 2 (casts): worst relative difference %.2e\n",
                      choice_name(b.model.ffn), k.name.c_str(), worst);
      }
}

// configs/tiny-jaxformer.json (Jaxformer's architecture at CPU size) in bf16
// on (2,2,2) with zero_stage 3 and recomputation, backward on its own thread.
TEST(Bf16, JaxformerZero3RecomputeOn222MatchesOneProcess) {
  if (test_runtime().size() != 8) GTEST_SKIP() << "the (2,2,2) mesh needs -np 8";
  const Config c = from_file(base("jaxformer"), "tiny-jaxformer.json");
  Case k{"222-zero3-full", 2, 2, 2, 1, false, "1f1b", 3, "full", 1, true};
  double worst = 0;
  expect_within(test::single_process_losses(c), test::train_losses(on(c, k), true), kMesh, "jaxformer", &worst);
  if (test_runtime().rank() == 0)
    std::printf("bf16 tiny-jaxformer (2,2,2) zero_stage 3 full recompute: worst relative difference %.2e\n", worst);
}

// Sampling through a bf16 pipeline (activations sent in bf16 between the
// stages) draws the tokens of one bf16 process: pp splits no sum.
TEST(Bf16, PipelineGenerateMatchesOneProcess) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "pp 2 needs -np 2";
  for (const Config& b : {dense("generate"), moe("generate-moe")}) {
    Config c = b;
    c.data.micro_batch_size = 2;  // the same microbatches on both: the same weights after training
    const SampleOptions so = test::sample_options();
    const test::Samples& prompts = test::kPrompts;
    const test::Samples one = test::one_process_samples(c, prompts, so);
    Config p = test::with_mesh(c, 1, 2, 1);
    p.name += "-pp2";
    const test::Samples piped = test::pipeline_samples(p, prompts, so);
    SCOPED_TRACE(choice_name(c.model.ffn));
    EXPECT_EQ(one, piped);
  }
}
