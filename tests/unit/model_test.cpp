// The single-device model: causality, mesh-independent init, parameter names,
// parameter counts, a short overfit, and pipeline-stage composition.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/model/activation.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/transformer.h"
#include "tiny_model.h"

namespace meshtrain {
namespace {

ModelConfig tiny(const std::string& attention = "mha", const std::string& ffn = "dense") {
  return test::tiny_model(parse_choice<AttentionKind>(attention).value(), parse_choice<FfnKind>(ffn).value());
}

at::Tensor random_tokens(const ModelConfig& c, int64_t B, int64_t T, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(c.vocab_size, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
}

std::set<std::string> names(const Transformer& m) {
  std::set<std::string> s;
  for (const auto& p : m.named_parameters()) s.insert(p.key());
  return s;
}

int64_t numel(const Transformer& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

class Causal : public ::testing::TestWithParam<std::string> {};

TEST_P(Causal, FutureTokensDoNotChangeEarlierLogitsOrLosses) {
  const auto cfg = tiny(GetParam());
  LayerFactory f;
  Transformer m(cfg, f);
  m.eval();
  const auto x = random_tokens(cfg, 2, cfg.T, 1);
  const auto y = random_tokens(cfg, 2, cfg.T, 2);
  auto x2 = x.clone();
  x2.narrow(1, 9, cfg.T - 9).random_(cfg.vocab_size);
  x2.select(1, 9).add_(1).remainder_(cfg.vocab_size);  // position 9 surely differs
  const auto l1 = m.logits(m.forward_layers(m.embed(x), nullptr));
  const auto l2 = m.logits(m.forward_layers(m.embed(x2), nullptr));
  EXPECT_TRUE(at::allclose(l1.narrow(1, 0, 9), l2.narrow(1, 0, 9), 0, 1e-6));
  EXPECT_FALSE(at::allclose(l1.narrow(1, 9, 1), l2.narrow(1, 9, 1), 0, 1e-4));
  const auto t1 = m.token_losses(m.forward_layers(m.embed(x), nullptr), y);
  const auto t2 = m.token_losses(m.forward_layers(m.embed(x2), nullptr), y);
  EXPECT_TRUE(at::allclose(t1.narrow(1, 0, 9), t2.narrow(1, 0, 9), 0, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(Attention, Causal, ::testing::Values("mha", "mla"));

TEST(Rope, KeepsNormsAndDependsOnlyOnRelativePosition) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto q = at::randn({1, 1, 1, 8}, gen);
  const auto k = at::randn({1, 1, 1, 8}, gen);
  const auto dot = [&](int64_t m, int64_t n) {
    return (apply_rope(q, m, 10000.0) * apply_rope(k, n, 10000.0)).sum().item<double>();
  };
  EXPECT_NEAR(dot(3, 1), dot(12, 10), 1e-5);
  EXPECT_GT(std::abs(dot(3, 1) - dot(3, 3)), 1e-4);
  EXPECT_NEAR(apply_rope(q, 7, 10000.0).norm().item<double>(), q.norm().item<double>(), 1e-5);
  EXPECT_TRUE(at::equal(apply_rope(q, 0, 10000.0), q));
}

TEST(Init, IndependentOfConstructionOrderAndGlobalRng) {
  const auto cfg = tiny();
  LayerFactory f;
  f.set_seed(7);
  torch::manual_seed(1);
  Transformer full(cfg, f);
  torch::manual_seed(2);
  (void)torch::randn({100});
  Transformer tail(cfg, f, StageRange{2, 4, false, true});  // built alone, later layers first
  const auto full_params = full.named_parameters();
  for (const auto& p : tail.named_parameters()) {
    if (p.key() == "embed.weight") continue;  // tied copy, checked below
    ASSERT_TRUE(full_params.contains(p.key())) << p.key();
    EXPECT_TRUE(at::equal(p.value(), full_params[p.key()])) << p.key();
  }
  EXPECT_TRUE(at::equal(tail.named_parameters()["embed.weight"], full_params["embed.weight"]));

  // Each weight is init_normal over its own name; output projections scaled down.
  EXPECT_TRUE(at::equal(full_params["layers.1.attn.wq.weight"],
                        init_normal(7, "layers.1.attn.wq.weight", {32, 32}, cfg.init_std)));
  EXPECT_TRUE(at::equal(full_params["layers.3.mlp.w_out.weight"],
                        init_normal(7, "layers.3.mlp.w_out.weight", {32, 24}, residual_std(cfg))));
  EXPECT_TRUE(at::equal(full_params["layers.0.attn_norm.weight"], at::ones({32})));

  // A different seed or name draws a different tensor; a slice of the global
  // draw is what a shard gets.
  EXPECT_FALSE(at::equal(init_normal(7, "a", {4, 4}, 1.0), init_normal(8, "a", {4, 4}, 1.0)));
  EXPECT_FALSE(at::equal(init_normal(7, "a", {4, 4}, 1.0), init_normal(7, "b", {4, 4}, 1.0)));
  EXPECT_NE(param_seed(0, "layers.1.attn.wq.weight"), param_seed(0, "layers.1.attn.wk.weight"));
  EXPECT_NEAR(init_normal(1, "x", {256, 256}, 0.5).std().item<double>(), 0.5, 0.01);
}

TEST(Names, MhaDenseUntied) {
  auto cfg = tiny();
  cfg.blocks = 1;
  cfg.tie_embeddings = false;
  LayerFactory f;
  Transformer m(cfg, f);
  std::set<std::string> want{"embed.weight", "final_norm.weight", "head.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* n : {"attn_norm.weight", "mlp_norm.weight", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight",
                          "attn.wo.weight", "mlp.w_in.weight", "mlp.w_out.weight"}) {
      want.insert(p + n);
    }
  }
  EXPECT_EQ(names(m), want);
}

TEST(Names, MlaStageWithGlobalIndicesAndNoRopeInLastLayerOfBlock) {
  auto cfg = tiny("mla");
  LayerFactory f;
  Transformer m(cfg, f, StageRange{2, 4, false, true});  // block 1: layers 2 (rope) and 3 (no rope)
  std::set<std::string> want{"embed.weight", "final_norm.weight"};  // tied copy on the last stage
  for (int i = 2; i < 4; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* n : {"attn_norm.weight", "mlp_norm.weight", "attn.w_dkv.weight", "attn.w_dq.weight",
                          "attn.w_uq.weight", "attn.w_uk.weight", "attn.w_uv.weight", "attn.wo.weight",
                          "mlp.w_in.weight", "mlp.w_out.weight"}) {
      want.insert(p + n);
    }
  }
  want.insert("layers.2.attn.w_qr.weight");
  want.insert("layers.2.attn.w_kr.weight");
  EXPECT_EQ(names(m), want);
  EXPECT_EQ(m.embedding(), nullptr);
  EXPECT_NE(m.head(), nullptr);
  EXPECT_EQ(m.n_local_layers(), 2);

  // The factory recorded every factory-made weight under its path, with the
  // split it has under tp; the head copy of the tied weight is marked.
  const auto& layouts = f.layouts();
  EXPECT_EQ(layouts.at("layers.2.attn.w_uq.weight").split_dim, 0);
  EXPECT_EQ(layouts.at("layers.2.attn.wo.weight").split_dim, 1);
  EXPECT_EQ(layouts.at("layers.2.attn.w_kr.weight").split_dim, -1);
  EXPECT_EQ(layouts.at("layers.3.mlp.w_in.weight").global_shape, (std::vector<int64_t>{24, 32}));
  EXPECT_TRUE(layouts.at("embed.weight").tied_copy);
  EXPECT_EQ(layouts.at("embed.weight").global_name, "embed.weight");
  EXPECT_FALSE(layouts.at("layers.2.attn.wo.weight").tied_copy);
}

TEST(Names, TiedSingleStageHasOneEmbeddingWeight) {
  LayerFactory f;
  Transformer m(tiny(), f);
  const auto n = names(m);
  EXPECT_TRUE(n.count("embed.weight"));
  EXPECT_FALSE(n.count("head.weight"));
}

struct CountCase {
  std::string attention, ffn;
  bool tied;
};

void PrintTo(const CountCase& c, std::ostream* os) {
  *os << c.attention << "/" << c.ffn << (c.tied ? "/tied" : "/untied");
}

class Count : public ::testing::TestWithParam<CountCase> {};

TEST_P(Count, ClosedFormMatchesBuiltModel) {
  auto cfg = tiny(GetParam().attention, GetParam().ffn);
  cfg.tie_embeddings = GetParam().tied;
  LayerFactory f;
  Transformer m(cfg, f);
  const auto c = count_params(cfg);
  EXPECT_EQ(c.total, numel(m));
  EXPECT_EQ(c.embedding, cfg.vocab_size * cfg.model_dimension * (cfg.tie_embeddings ? 1 : 2));
  // Active: every parameter except the routed experts, of which k of E count.
  int64_t other = 0;
  int64_t routed = 0;
  for (const auto& p : m.named_parameters()) {
    if (p.key().find(".moe.experts.") != std::string::npos) {
      routed += p.value().numel();
    } else {
      other += p.value().numel();
    }
  }
  if (cfg.ffn == FfnKind::Moe) {
    ASSERT_GT(routed, 0);
    EXPECT_EQ(c.active, other + routed / cfg.n_experts * cfg.k);
  } else {
    EXPECT_EQ(c.active, c.total);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, Count,
                         ::testing::Values(CountCase{"mha", "dense", true}, CountCase{"mha", "dense", false},
                                           CountCase{"mla", "dense", true}, CountCase{"mla", "dense", false},
                                           CountCase{"mha", "moe", true}, CountCase{"mla", "moe", false}));

class Overfit : public ::testing::TestWithParam<std::string> {};

TEST_P(Overfit, LossFallsOnARepeatedBatch) {
  auto cfg = tiny(GetParam());
  cfg.init_std = 0.02;
  LayerFactory f;
  Transformer m(cfg, f);
  m.train();
  const auto x = random_tokens(cfg, 4, cfg.T, 5);
  const auto y = x.roll(-1, 1);
  torch::optim::Adam opt(m.parameters(), torch::optim::AdamOptions(1e-2));
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    opt.zero_grad();
    auto loss = m.loss(x, y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(static_cast<double>(cfg.vocab_size)), 0.3);
  EXPECT_LT(last, 0.3 * first);
}

INSTANTIATE_TEST_SUITE_P(Attention, Overfit, ::testing::Values("mha", "mla"));

class Stages : public ::testing::TestWithParam<CountCase> {};

TEST_P(Stages, ComposedStagesGiveTheFullModelsLossAndGradients) {
  auto cfg = tiny(GetParam().attention, GetParam().ffn);
  cfg.tie_embeddings = GetParam().tied;
  LayerFactory f;
  f.set_seed(11);
  Transformer full(cfg, f);
  Transformer first(cfg, f, StageRange{0, 2, true, false});
  Transformer last(cfg, f, StageRange{2, -1, false, true});
  EXPECT_EQ(first.head(), nullptr);
  EXPECT_EQ(last.embedding(), nullptr);
  const auto x = random_tokens(cfg, 2, cfg.T, 3);
  const auto y = random_tokens(cfg, 2, cfg.T, 4);

  ForwardAux aux_full, aux_first, aux_last;
  const auto want = full.loss(x, y, &aux_full);
  const auto h = first.forward_layers(first.embed(x), &aux_first);
  const auto got = last.token_losses(last.forward_layers(h, &aux_last), y).mean();
  EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-6);
  if (cfg.ffn == FfnKind::Moe) {
    const auto split = aux_first.aux_loss + aux_last.aux_loss;
    EXPECT_NEAR(split.item<double>(), aux_full.aux_loss.item<double>(), 1e-6);
  }

  want.backward();
  got.backward();
  const auto g_full = full.named_parameters();
  const auto g_last = last.named_parameters();
  const auto name = std::string("layers.3.attn.wo.weight");
  EXPECT_TRUE(at::allclose(g_last[name].grad(), g_full[name].grad(), 1e-4, 1e-7));
}

INSTANTIATE_TEST_SUITE_P(Configs, Stages,
                         ::testing::Values(CountCase{"mha", "dense", true}, CountCase{"mha", "dense", false},
                                           CountCase{"mla", "moe", true}));

// The one formula per activation that the dense MLP and the experts share.
TEST(Activation, FormulasAndGating) {
  torch::manual_seed(3);
  const at::Tensor in = torch::randn({4, 6}), gate = torch::randn({4, 6});
  EXPECT_TRUE(at::allclose(apply_activation(MlpActivation::Gelu, in, {}),
                           0.5 * in * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (in + 0.044715 * in.pow(3))))));
  EXPECT_TRUE(at::allclose(apply_activation(MlpActivation::Swiglu, in, gate), gate * at::sigmoid(gate) * in));
  EXPECT_FALSE(is_gated(MlpActivation::Gelu));
  EXPECT_TRUE(is_gated(MlpActivation::Swiglu));
  // A gated activation without its gate (or the reverse) is a bug, not a silent GELU.
  EXPECT_THROW(apply_activation(MlpActivation::Swiglu, in, {}), Error);
  EXPECT_THROW(apply_activation(MlpActivation::Gelu, in, gate), Error);
}

TEST(Aux, AccumulatesFromUndefined) {
  ForwardAux a;
  a.add_aux(at::full({}, 2.0));
  a.add_aux(at::full({}, 3.0));
  a.add_z(at::full({}, 1.5));
  EXPECT_DOUBLE_EQ(a.aux_loss.item<double>(), 5.0);
  EXPECT_DOUBLE_EQ(a.z_loss.item<double>(), 1.5);
}

TEST(Errors, BadConfigsAndMissingStagePiecesThrow) {
  LayerFactory f;
  auto cfg = tiny();
  EXPECT_THROW(Transformer(cfg, f, StageRange{3, 9, true, true}), std::exception);
  Transformer mid(cfg, f, StageRange{1, 2, false, false});
  EXPECT_THROW(mid.embed(random_tokens(cfg, 1, 4, 0)), std::exception);
  EXPECT_THROW(mid.logits(at::zeros({1, 4, 32})), std::exception);
}

}  // namespace
}  // namespace meshtrain
