// The Jaxformer moe1B model, exactly: the published config file
// (configs/jaxformer/moe1B.json) loaded as it is builds Jaxformer's
// architecture, with its 949,248,384 parameters of which 343,321,728 are
// active, in the formula, the plan and the built model (on the meta device).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/perf/plan.h"

namespace meshtrain {
namespace {

const std::string kPublished = std::string(MT_SOURCE_DIR) + "/configs/jaxformer/moe1B.json";
const std::string kTiny = std::string(MT_SOURCE_DIR) + "/configs/tiny-jaxformer.json";
constexpr int64_t kTotal = 949'248'384;
constexpr int64_t kActive = 343'321'728;

std::map<std::string, std::vector<int64_t>> shapes(const Transformer& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().sizes().vec();
  return out;
}

TEST(Jaxformer, PublishedFileLoadsAsJaxformersArchitecture) {
  const ModelConfig m = load_config(kPublished).config.model;
  EXPECT_EQ(m.architecture, Architecture::Jaxformer);
  EXPECT_EQ(m.attention, AttentionKind::Mla);
  EXPECT_EQ(m.ffn, FfnKind::Moe);
  EXPECT_EQ(m.moe_layers, MoeLayers::LastInBlock);
  EXPECT_TRUE(m.mla_last_layer_no_rope);
  EXPECT_EQ(m.mla_rope_input, MlaRopeInput::JointLatent);
  EXPECT_TRUE(m.linear_bias);
  EXPECT_TRUE(m.norm_bias);
  EXPECT_EQ(m.router_score, RouterScore::Sigmoid);
  EXPECT_EQ(m.shared_expert, SharedExpert::LinearDiscarded);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_EQ(m.hidden_dim(), 4 * 768);
  EXPECT_EQ(m.active_params_scope, ActiveParamsScope::Layers);
  EXPECT_DOUBLE_EQ(m.capacity_factor, 1.5);  // the file's value wins over the preset's
  EXPECT_EQ(m.n_layers(), 48);
}

TEST(Jaxformer, PublishedCountsInFormulaPlanAndBuiltModel) {
  const Config c = load_config(kPublished).config;
  const ParamCount f = count_params(c.model);
  EXPECT_EQ(f.total, kTotal);
  EXPECT_EQ(f.active, kActive);

  const MemoryPlan p = plan_memory(c, PlanDevice::Cuda);
  EXPECT_EQ(p.total_params, kTotal);
  EXPECT_EQ(p.active_params, kActive);
  EXPECT_EQ(p.dp, 8);
  EXPECT_EQ(p.pp, 2);
  EXPECT_EQ(p.tp, 2);

  // The built model: every parameter created through the real factory calls,
  // on the meta device (3.8 GB of fp32 weights would not fit a small CI box).
  MetaLayerFactory meta;
  const Transformer model(c.model, meta);
  const ParamCount b = count_built_params(model);
  EXPECT_EQ(b.total, kTotal);
  EXPECT_EQ(b.active, kActive);
  EXPECT_EQ(built_param_count(c.model), kTotal);

  // The two pipeline stages of the published mesh hold the whole model, plus
  // the tied head's copy on the last stage, with the vocabulary padded to a
  // multiple of tp (100,277 -> 100,278 rows).
  int64_t whole = 0;
  for (int64_t s = 0; s < 2; ++s) {
    const StageParams sp = stage_params(c.model, 2, 2, s);
    whole += sp.split * 2 + sp.replicated;
  }
  EXPECT_EQ(whole, kTotal - 100277 * 768 + 2 * 100278 * 768);
}

// Each architecture fact, as the built model's parameter shapes show it
// (docs/JAXFORMER.md lists where each comes from in Jaxformer's code).
TEST(Jaxformer, BuiltModelHasJaxformersLayers) {
  const ModelConfig m = load_config(kPublished).config.model;
  MetaLayerFactory meta;
  const Transformer model(m, meta);
  const auto s = shapes(model);
  auto has = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = s.find(name);
    if (it == s.end()) return ::testing::AssertionFailure() << name << " missing";
    if (it->second != shape) return ::testing::AssertionFailure() << name << " has another shape";
    return ::testing::AssertionSuccess();
  };
  // Tied embedding, final RMSNorm with a bias, no separate head.
  EXPECT_TRUE(has("embed.weight", {100277, 768}));
  EXPECT_TRUE(has("final_norm.weight", {768}));
  EXPECT_TRUE(has("final_norm.bias", {768}));
  EXPECT_EQ(s.count("head.weight"), 0u);
  for (int64_t i = 0; i < 48; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    const bool last = i % 6 == 5;
    EXPECT_TRUE(has(l + "attn_norm.bias", {768}));
    EXPECT_TRUE(has(l + "attn.w_dkv.bias", {128}));
    EXPECT_TRUE(has(l + "attn.wo.bias", {768}));
    // Rope projections read the 2*latent down-projection output; none in a block's last layer.
    EXPECT_EQ(s.count(l + "attn.w_qr.weight"), last ? 0u : 1u) << l;
    if (!last) {
      EXPECT_TRUE(has(l + "attn.w_qr.weight", {12 * 128, 256}));
      EXPECT_TRUE(has(l + "attn.w_kr.weight", {128, 256}));
    }
    // One MoE layer per block, the block's last; dense GELU MLPs elsewhere.
    EXPECT_EQ(s.count(l + "moe.router.weight"), last ? 1u : 0u) << l;
    EXPECT_EQ(s.count(l + "mlp.w_in.weight"), last ? 0u : 1u) << l;
    if (last) {
      EXPECT_TRUE(has(l + "moe.router.bias", {16}));
      EXPECT_TRUE(has(l + "moe.experts.w_in", {16, 3072, 768}));
      EXPECT_TRUE(has(l + "moe.experts.b_in", {16, 3072}));
      EXPECT_TRUE(has(l + "moe.experts.b_out", {16, 768}));
      EXPECT_TRUE(has(l + "moe.shared_proj.weight", {2 * 768, 768}));  // one linear, not MLPs
      EXPECT_TRUE(has(l + "moe.shared_proj.bias", {2 * 768}));
    }
  }
}

// Per-layer arithmetic (docs/JAXFORMER.md): a dense layer 6,237,824, a MoE
// layer 77,840,144 of which 14 routed experts (66,114,048) are inactive.
TEST(Jaxformer, PerLayerCounts) {
  const ModelConfig m = load_config(kPublished).config.model;
  EXPECT_EQ(layer_param_count(m, 0).total(), 6'237'824);
  const LayerParamCount moe = layer_param_count(m, 5);
  EXPECT_EQ(moe.total(), 77'840'144);
  EXPECT_EQ(moe.routed, 16 * 4'722'432);
  EXPECT_EQ(40 * 6'237'824 + 8 * 77'840'144 + 100277 * 768 + 2 * 768, kTotal);
}

// The rule that makes the published file a Jaxformer model, and its limits.
TEST(Jaxformer, ArchitectureRule) {
  // Explicitly meshtrain: today's reading of the file, dense MHA.
  Config c = load_config(kPublished, {"model_config.architecture=meshtrain"}).config;
  EXPECT_EQ(c.model.attention, AttentionKind::Mha);
  EXPECT_EQ(c.model.ffn, FfnKind::Dense);
  EXPECT_EQ(count_params(c.model).total, 416'825'856);
  // Overriding one key keeps the other Jaxformer defaults (the file as written decides).
  c = load_config(kPublished, {"model_config.shared_expert=linear"}).config;
  EXPECT_EQ(c.model.architecture, Architecture::Jaxformer);
  EXPECT_EQ(c.model.shared_expert, SharedExpert::Linear);
  EXPECT_EQ(count_params(c.model).total, kTotal);  // the fix changes the output, not the count
  c = load_config(kPublished, {"model_config.moe_layers=all"}).config;
  EXPECT_EQ(c.model.attention, AttentionKind::Mla);
  EXPECT_GT(count_params(c.model).total, kTotal);
  // meshtrain's own files name attention/ffn and keep meshtrain's defaults.
  c = load_config(std::string(MT_SOURCE_DIR) + "/configs/moe1b.json").config;
  EXPECT_EQ(c.model.architecture, Architecture::Auto);  // resolved as meshtrain, left as written
  EXPECT_FALSE(c.model.linear_bias);
  EXPECT_EQ(count_params(c.model).total, 4'218'241'536);
  EXPECT_EQ(count_params(c.model).active, 1'047'347'712);
  // A bad value names the key.
  try {
    load_config(kPublished, {"model_config.architecture=gpt"});
    ADD_FAILURE() << "no error for architecture=gpt";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model_config.architecture"), std::string::npos) << e.what();
  }
  // A saved config (every key written) reads back as the same model.
  const Config j = load_config(kPublished).config;
  const Config back = config_from_json(to_json(j));
  EXPECT_EQ(to_json(back), to_json(j));
}

// The tiny model of the same architecture (used by the parity tests) builds
// for real on the CPU, its formula matches it, and it trains on a batch.
TEST(Jaxformer, TinyConfigBuildsAndLearns) {
  ModelConfig m = load_config(kTiny).config.model;
  ASSERT_EQ(m.architecture, Architecture::Jaxformer);
  for (SharedExpert shared : {SharedExpert::LinearDiscarded, SharedExpert::Linear}) {
    m.shared_expert = shared;
    LayerFactory f;
    Transformer model(m, f);
    const ParamCount built = count_built_params(model), formula = count_params(m);
    EXPECT_EQ(built.total, formula.total) << shared;
    EXPECT_EQ(built.active, formula.active) << shared;
    model.train();
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    const at::Tensor x = at::randint(m.vocab_size, {4, m.T}, gen, at::TensorOptions().dtype(at::kLong));
    ForwardAux aux;
    const at::Tensor loss = model.loss(x, x.roll(-1, 1), &aux);
    loss.backward();
    ASSERT_TRUE(aux.aux_loss.defined());
    EXPECT_EQ(aux.expert_tokens.size(), 2u) << "one MoE layer in each of the 2 blocks";
    int64_t with_grad = 0, shared_grads = 0;
    for (const auto& p : model.named_parameters()) {
      if (!p.value().grad().defined()) continue;
      ++with_grad;
      if (p.key().find("shared_proj") != std::string::npos) ++shared_grads;
    }
    // Jaxformer's code drops the shared term: its parameters get no gradient.
    EXPECT_EQ(shared_grads, shared == SharedExpert::Linear ? 4 : 0) << shared;
    EXPECT_GT(with_grad, 40) << shared;
  }
}

// The corrected shared expert changes what the layer computes.
TEST(Jaxformer, LinearSharedExpertAddsItsTerm) {
  ModelConfig m = load_config(kTiny).config.model;
  m.init_std = 0.2;
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = at::randint(m.vocab_size, {2, m.T}, gen, at::TensorOptions().dtype(at::kLong));
  std::vector<at::Tensor> logits;
  for (SharedExpert shared : {SharedExpert::LinearDiscarded, SharedExpert::Linear}) {
    m.shared_expert = shared;
    LayerFactory f;
    Transformer model(m, f);
    model.eval();
    logits.push_back(model.logits(model.forward_layers(model.embed(x), nullptr)));
  }
  EXPECT_GT((logits[0] - logits[1]).abs().max().item<double>(), 1e-3);
}

}  // namespace
}  // namespace meshtrain
