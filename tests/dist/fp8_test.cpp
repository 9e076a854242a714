// FP8 recipes on CPU ranks (model_config.fp8_recipe, model/fp8_linear.h):
// every mesh is one FP8 process.
//
// Two levels. The layers: a tp column -> row pair (with and without
// sequence parallelism), a replicated layer reading the sequence shard, and
// a layer whose tokens are split as context parallelism splits them, each
// against the same layer on one rank fed the same global tensors. Their
// scales are one process's exactly (the amax reductions of Fp8Split), so
// every element differs only where the bf16 mesh differs -- a tp partial sum
// rounded to bf16 before the all-reduce adds the other's: 2u = 2^-7 of the
// largest element -- and the fp32 weight gradients by fp32 round-off. A
// scale taken over a shard instead moves an element by up to half an e4m3
// step, 2^-4 of itself, and a GEMM output by about 2^-5 of its size: far
// past 2^-7.
//
// The meshes: tp 2 with sequence parallelism, dp 2 with zero_stage 3, pp 2,
// ep 2 (MoE, by capacity and dropless) and cp 2 train 3 steps of the tests'
// dense and MLA + MoE models (configs/tiny.json, tiny-moe-mla.json; bf16
// with each recipe) against one FP8 process running the same microbatches
// (data_config.micro_batch_size: a rank's microbatch is the one process's,
// so the token-spanning scales are the same), on losses and gradient norms.
// The tolerance, derived from bf16's (bf16_test.cpp: kMesh = 2u, two
// roundings of one aggregate a neighbouring ulp apart): the mesh's bf16
// round-off differences reach the FP8 operands, and a value that moved by
// d crosses an FP8 rounding boundary with probability d / q (q the e4m3
// step, 2^-3 of the value against bf16's 2^-7, so q / d = 16) and then moves
// by q: the same mean, d, but a variance q d instead of d^2, so the
// aggregates' random differences are sqrt(16) = 4 times bf16's:
//   FP8 mesh vs one FP8 process:  kFp8Mesh = 4 kMesh = 2^-5 (3.1%).
// Measured worst (the test prints every case's): 6.5e-3 (dense blockwise,
// tp 2 + sequence parallelism, the 256-wide model); dp, pp and ep run one
// process's GEMMs on one process's operands and stay within 2e-4. A scale
// taken over a shard instead (the layer tests' negative controls) is off by
// 2e-2 to 1.4e-1 in a single layer.
// The losses alone could not tell FP8 from bf16 within that, so each mesh
// also counts its FP8 GEMMs (ops/paths.h) on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/parallel/tensor_parallel.h"
#include "meshtrain/perf/path_counter.h"
#include "parity.h"

using namespace meshtrain;

namespace {

constexpr double kU = 1.0 / 256;  // 2^-8: bf16's rounding, relative
constexpr double kMesh = 2 * kU;
constexpr double kFp8Mesh = 4 * kMesh;

constexpr Fp8Recipe kRecipes[] = {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise, Fp8Recipe::Blockwise};

const std::string kData = test::scratch_dir("fp8-data");

at::Tensor seeded(std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, scale, shape, gen, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor chunk(const at::Tensor& t, int64_t dim, int rank, int n) { return t.chunk(n, dim)[rank]; }

// max |got - want| / max |want|, the worst of every rank.
double max_error(const at::Tensor& want, const at::Tensor& got) {
  const double scale = want.to(at::kDouble).abs().max().item<double>();
  at::Tensor err = ((want.to(at::kDouble) - got.to(at::kDouble)).abs().max() / scale).to(at::kFloat).reshape({1});
  test_runtime().world()->all_reduce(err, ReduceOp::Max);
  return err.item<double>();
}

std::shared_ptr<MixedPrecision> fp8_policy(Fp8Recipe r) {
  return std::make_shared<MixedPrecision>(PrecisionPolicy::from_model_dtype(ModelDtype::Bfloat16, r));
}

at::Tensor weight_of(torch::nn::Module& m) { return m.named_parameters()["weight"]; }

}  // namespace

// A column -> row pair (the MLP, attention's projections) on tp ranks
// against one rank, with and without sequence parallelism: the forward, the
// input's gradient and both weights' gradients, each within the bf16 mesh's
// own rounding (2u of the largest element). Widths are whole 128-tiles per
// rank where tp splits them (blockwise), 160 (a partial tile) where it does
// not. Without the tp reductions (the weights marked with an empty split:
// each rank's scales its shard's) the same pair is off by far more.
TEST(Fp8Layers, ColumnAndRowOnTpAreOneProcess) {
  const int n = test_runtime().size();
  if (n != 2) GTEST_SKIP() << "tp 2 needs -np 2";
  Mesh mesh(test_runtime(), MeshShape{1, 1, n});
  const int r = mesh.coord().tp;
  const int64_t d = 160, hidden = 256 * n, B = 2, T = 8;
  for (bool reduced : {true, false})
    for (bool sp : {false, true})
      for (Fp8Recipe recipe : kRecipes) {
        if (!reduced && (sp || recipe == Fp8Recipe::Blockwise)) continue;  // blockwise reduces nothing
        SCOPED_TRACE(std::string(choice_name(recipe)) + (sp ? " sequence_parallel" : "") + (reduced ? "" : " unreduced"));
        Config cfg;
        cfg.device.n_device_axis = {1, 1, n};
        cfg.sequence_parallel = sp;
        LayerFactory plain;
        plain.set_precision(fp8_policy(recipe));
        auto tp = make_layer_factory(cfg, mesh);
        tp->set_precision(fp8_policy(recipe));
        plain.set_seed(3);
        tp->set_seed(3);
        auto pc = plain.column("l.w_in", d, hidden, 0.05), pr = plain.row("l.w_out", hidden, d, 0.05);
        auto tc = tp->column("l.w_in", d, hidden, 0.05), tr = tp->row("l.w_out", hidden, d, 0.05);
        if (!reduced)
          for (Linear* l : {tc.get(), tr.get()}) tp->precision()->mark_fp8(l->weight(), std::make_shared<Fp8Split>());
        const at::Tensor x = seeded({B, T, d}, 4).to(at::kBFloat16);
        const at::Tensor dy = seeded({B, T, d}, 5, 1e-2).to(at::kBFloat16);
        const at::Tensor xp = x.clone().requires_grad_(true);
        const at::Tensor xt = (sp ? chunk(x, 1, r, n) : x).clone().requires_grad_(true);
        const auto mlp = [](Linear& in, Linear& out, const at::Tensor& v) {
          return out.forward(at::gelu(in.forward(v)));
        };
        const at::Tensor yp = mlp(*pc, *pr, xp), yt = mlp(*tc, *tr, xt);
        yp.backward(dy);
        yt.backward(sp ? chunk(dy, 1, r, n) : dy);
        const double e[4] = {max_error(sp ? chunk(yp, 1, r, n) : yp, yt),
                             max_error(sp ? chunk(xp.grad(), 1, r, n) : xp.grad(), xt.grad()),
                             max_error(chunk(weight_of(*pc).grad(), 0, r, n), weight_of(*tc).grad()),
                             max_error(chunk(weight_of(*pr).grad(), 1, r, n), weight_of(*tr).grad())};
        if (reduced)
          for (double err : e) EXPECT_LE(err, kMesh);
        else
          EXPECT_GT(*std::max_element(e, e + 4), 2 * kMesh);
        if (test_runtime().rank() == 0)
          std::printf("%-10s %-18s y %.2e, dx %.2e, column dW %.2e, row dW %.2e (of the largest; tolerance %.2e)\n",
                      choice_name(recipe), reduced ? (sp ? "sequence_parallel" : "") : "not reduced", e[0], e[1],
                      e[2], e[3], kMesh);
      }
}

// The worst over rows of max |got - want| / max |want| within the row: each
// token's outputs on their own scale (the largest tokens would hide a small
// one's error), the worst of every rank.
double row_error(const at::Tensor& want, const at::Tensor& got) {
  const at::Tensor w = want.to(at::kDouble).reshape({-1, want.size(-1)});
  const at::Tensor g = got.to(at::kDouble).reshape({-1, got.size(-1)});
  at::Tensor err = ((w - g).abs().amax(1) / w.abs().amax(1)).max().to(at::kFloat).reshape({1});
  test_runtime().world()->all_reduce(err, ReduceOp::Max);
  return err.item<double>();
}

// A replicated layer reading the sequence shard (MLA's down-projections)
// under sequence parallelism: each rank's tokens are quantized with the
// whole sequence's scales, and the weight gradients, summed over tp, are
// one process's to fp32 round-off. The same holds for context
// parallelism's token split (MixedPrecision::set_fp8_token_reduce), and
// without that reduction (each rank's own scales) the same checks fail: the
// second rank's tokens are 100x the first's.
TEST(Fp8Layers, TokenShardsAreOneProcess) {
  const int n = test_runtime().size();
  if (n != 2) GTEST_SKIP() << "2 ranks (-np 2)";
  Mesh mesh(test_runtime(), MeshShape{1, 1, n});
  const int r = mesh.coord().tp;
  enum Split { kSp, kCp, kUnreduced };
  for (Split how : {kSp, kCp, kUnreduced})
    for (Fp8Recipe recipe : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) {
      const char* name = how == kSp ? "sp shard" : how == kCp ? "context split" : "context split, not reduced";
      SCOPED_TRACE(std::string(choice_name(recipe)) + " " + name);
      Config cfg;
      cfg.device.n_device_axis = {1, 1, n};
      cfg.sequence_parallel = how == kSp;
      LayerFactory plain;
      plain.set_precision(fp8_policy(recipe));
      std::unique_ptr<LayerFactory> split = how == kSp ? make_layer_factory(cfg, mesh) : std::make_unique<LayerFactory>();
      split->set_precision(fp8_policy(recipe));
      if (how == kCp) {
        Communicator* c = &mesh.tp();
        split->precision()->set_fp8_token_reduce([c](at::Tensor& a) { c->all_reduce(a, ReduceOp::Max); });
      }
      plain.set_seed(5);
      split->set_seed(5);
      auto lp = plain.replicated("l.w_dkv", 96, 40, 0.05, false, SequenceInput::Shard);
      auto lt = split->replicated("l.w_dkv", 96, 40, 0.05, false, SequenceInput::Shard);
      const at::Tensor x = (seeded({2, 16, 96}, 6) * at::cat({at::ones({1, 8, 1}), at::full({1, 8, 1}, 100.0)}, 1))
                               .to(at::kBFloat16);
      const at::Tensor dy = seeded({2, 16, 40}, 7, 1e-2).to(at::kBFloat16);
      const at::Tensor yp = lp->forward(x), yt = lt->forward(chunk(x, 1, r, n));
      yp.backward(dy);
      yt.backward(chunk(dy, 1, r, n));
      const double ey = row_error(chunk(yp, 1, r, n), yt);
      at::Tensor dw = weight_of(*lt).grad().clone();
      mesh.tp().all_reduce(dw);
      const double ew = row_error(weight_of(*lp).grad(), dw);
      if (how == kUnreduced) {
        // (Rowwise forward scales are per token: only its weight gradient's span tokens.)
        if (recipe == Fp8Recipe::Tensorwise) EXPECT_GT(ey, kMesh);
        EXPECT_GT(ew, 1e-3);
      } else {
        EXPECT_LE(ey, kU) << "y";
        EXPECT_LE(ew, 1e-5) << "dW summed over the ranks";
      }
      if (test_runtime().rank() == 0)
        std::printf("%-10s %-26s y %.2e, dW summed over the ranks %.2e (worst row, relative to its largest)\n",
                    choice_name(recipe), name, ey, ew);
    }
}

namespace {

// configs/<file>'s model at the tests' T and vocabulary, bf16 with `recipe`.
Config from_file(const std::string& name, const std::string& file, Fp8Recipe recipe) {
  Config c = test::tiny_config(test::synthetic_data(kData, 96),
                               name + "-" + choice_name(recipe) + "-np" + std::to_string(test_runtime().size()));
  ModelConfig m = load_config(std::string(MT_SOURCE_DIR) + "/configs/" + file).config.model;
  m.T = c.model.T;
  m.vocab_size = c.model.vocab_size;
  m.dropout_rate = 0.0;
  m.model_dtype = ModelDtype::Bfloat16;
  m.fp8_recipe = recipe;
  c.model = m;
  c.alpha = 0.01;
  c.training_steps = 3;
  c.eval_steps = 0;
  c.grad_clip_norm = 1.0;
  c.inference.max_tokens = 0;
  return c;
}

struct Case {
  std::string name;
  int dp = 1, pp = 1, tp = 1, ep = 1, cp = 1;
  bool sp = false;
  int zero = 0;
  int64_t micro = 0;  // the one process runs the same microbatches
  bool moe_only = false;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"tp2-sp", 1, 1, 2, 1, 1, true, 0, 0},  {"dp2-zero3", 2, 1, 1, 1, 1, false, 3, 2},
      {"pp2", 1, 2, 1, 1, 1, false, 0, 2},    {"ep2", 2, 1, 1, 2, 1, false, 0, 2, true},
      {"cp2", 1, 1, 1, 1, 2, false, 0, 0},
  };
  return all;
}

Config on(Config c, const Case& k) {
  c = test::with_mesh(c, k.dp, k.pp, k.tp);
  c.device.expert_parallel = k.ep;
  c.device.context_parallel = k.cp;
  c.sequence_parallel = k.sp;
  c.zero_stage = k.zero;
  c.data.micro_batch_size = k.micro;
  c.name += "-" + k.name;
  return c;
}

// Where the config refuses the recipe on this mesh (blockwise: tiles cut by tp or cp).
bool refused(const Config& c) {
  try {
    validate(c);
    return false;
  } catch (const std::exception&) {
    return true;
  }
}

void expect_meshes_match_one_process(const std::string& name, const std::string& file, double capacity_factor) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "the FP8 meshes run on -np 2";
  for (Fp8Recipe recipe : kRecipes)
    for (const Case& k : cases()) {
      Config model = from_file(name, file, recipe);
      if (capacity_factor >= 0) model.model.capacity_factor = capacity_factor;
      if (k.moe_only && model.model.ffn != FfnKind::Moe) continue;
      // Blockwise under tp: whole 128-wide tiles per rank, the dense model at 256 wide.
      if (k.tp > 1 && recipe == Fp8Recipe::Blockwise && model.model.ffn == FfnKind::Dense)
        model.model.model_dimension = 256;
      const Config c = on(model, k);
      if (refused(c)) continue;  // blockwise: tiles a mesh would cut
      SCOPED_TRACE(name + " " + choice_name(recipe) + " on " + k.name);
      Config ref = model;
      ref.data.micro_batch_size = k.micro;
      ref.name = c.name + "-ref";
      const test::Curve one = test::single_process_losses(ref);
      PathCounter paths;
      const test::Curve got = test::train_losses(c, true);
      const auto counted = paths.counts();
      const auto it = counted.find("fp8_mm");
      EXPECT_TRUE(it != counted.end() && it->second.fast + it->second.fallback > 0)
          << "no FP8 GEMM ran on rank " << test_runtime().rank();
      ASSERT_EQ(one.size(), got.size());
      double worst = 0;
      for (size_t i = 0; i < one.size(); ++i) {
        EXPECT_NEAR(one[i], got[i], kFp8Mesh * std::abs(one[i])) << "loss of step " << i + 1;
        EXPECT_NEAR(one.grad_norms[i], got.grad_norms[i], kFp8Mesh * one.grad_norms[i]) << "grad norm of step " << i + 1;
        worst = std::max({worst, std::abs(one[i] - got[i]) / std::abs(one[i]),
                          std::abs(one.grad_norms[i] - got.grad_norms[i]) / one.grad_norms[i]});
      }
      if (test_runtime().rank() == 0)
        std::printf("fp8 %-9s %-10s %-9s worst relative difference from one FP8 process %.2e (tolerance %.2e)\n",
                    name.c_str(), choice_name(recipe), k.name.c_str(), worst, kFp8Mesh);
    }
}

}  // namespace

TEST(Fp8, DenseMeshesMatchOneProcess) { expect_meshes_match_one_process("dense", "tiny.json", -1.0); }
TEST(Fp8, MoeMlaMeshesMatchOneProcess) { expect_meshes_match_one_process("moe", "tiny-moe-mla.json", -1.0); }
TEST(Fp8, DroplessMoeMeshesMatchOneProcess) { expect_meshes_match_one_process("dropless", "tiny-moe-mla.json", 0.0); }
