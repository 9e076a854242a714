// The Hugging Face mapping without files or Python: every parameter of a built
// model maps to an HF tensor and back unchanged, the HF tensors have the
// shapes config.json implies, config.json reads back to the same model keys,
// and models without a stock equivalent are refused with every reason.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "data_test_util.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/hf/hf_dir.h"
#include "meshtrain/hf/hf_model.h"
#include "meshtrain/model/transformer.h"
#include "tiny_model.h"

namespace meshtrain {
namespace {

ModelConfig llama() {
  ModelConfig m;
  m.model_dimension = 32;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.vocab_size = 50;
  m.mlp_activation = MlpActivation::Swiglu;
  m.tie_embeddings = false;
  return m;
}

ModelConfig v3() { return test::tiny_v3_model(); }

// Parameters of a built model with random values (norms and biases too).
std::map<std::string, at::Tensor> random_params(const ModelConfig& m) {
  LayerFactory plain;
  Transformer model(m, plain);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.key()] = at::randn(p.value().sizes());
  return out;
}

TensorSource from(const std::map<std::string, at::Tensor>& t) {
  return [&t](const std::string& name) {
    const auto it = t.find(name);
    if (it == t.end()) throw std::runtime_error("no tensor " + name);
    return it->second;
  };
}

void expect_round_trip(const ModelConfig& m) {
  const auto params = random_params(m);
  const NamedTensors hf = to_hf_tensors(m, from(params));
  std::map<std::string, at::Tensor> by_name(hf.begin(), hf.end());
  const auto back = from_hf_tensors(m, from(by_name));
  ASSERT_EQ(back.size(), params.size());
  for (const auto& [name, t] : params) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_TRUE(at::equal(back.at(name), t)) << name;
  }
  // config.json reads back to the same architecture.
  const ModelConfig again = model_config_from_hf(hf_config_json(m, 49), m);
  EXPECT_EQ(count_params(again).total, count_params(m).total);
  EXPECT_EQ(again.kv_heads(), m.kv_heads());
  EXPECT_EQ(again.mlp_activation, m.mlp_activation);
}

TEST(HfMapping, LlamaRoundTrips) { expect_round_trip(llama()); }
TEST(HfMapping, DeepSeekV3RoundTrips) { expect_round_trip(v3()); }

TEST(HfMapping, GeluMlpBecomesLlamaMlpWithConstantUp) {
  ModelConfig m = llama();
  m.mlp_activation = MlpActivation::Gelu;
  expect_round_trip(m);
  const auto hf = to_hf_tensors(m, from(random_params(m)));
  std::map<std::string, at::Tensor> t(hf.begin(), hf.end());
  EXPECT_TRUE(t.at("model.layers.0.mlp.up_proj.weight").eq(0).all().item<bool>());
  EXPECT_TRUE(t.at("model.layers.0.mlp.up_proj.bias").eq(1).all().item<bool>());
  EXPECT_EQ(hf_config_json(m, 0).at("hidden_act"), "gelu_pytorch_tanh");
  // A general biased MLP is not meshtrain's GELU.
  t["model.layers.0.mlp.up_proj.bias"] = at::full({m.hidden_dim()}, 2.0);
  EXPECT_THROW(from_hf_tensors(m, from(t)), std::exception);
}

TEST(HfMapping, RopelessMlaLayerIsZeroRopeRowsAndRescaledQueries) {
  ModelConfig m = v3();
  m.mla_last_layer_no_rope = true;  // layer 1 has no rope
  const auto params = random_params(m);
  const auto hf = to_hf_tensors(m, from(params));
  std::map<std::string, at::Tensor> t(hf.begin(), hf.end());
  const at::Tensor qb = t.at("model.layers.1.self_attn.q_b_proj.weight").view({4, 8 + 4, 16});
  EXPECT_TRUE(qb.narrow(1, 8, 4).eq(0).all().item<bool>());
  EXPECT_TRUE(t.at("model.layers.1.self_attn.kv_a_proj_with_mqa.weight").narrow(0, 16, 4).eq(0).all().item<bool>());
  EXPECT_TRUE(at::allclose(qb.narrow(1, 0, 8).reshape({32, 16}),
                           params.at("layers.1.attn.w_uq.weight") * std::sqrt(12.0 / 8.0)));
}

TEST(HfMapping, UnmappableModelsListEveryReason) {
  ModelConfig jax = v3();
  jax.mlp_activation = MlpActivation::Gelu;
  jax.mla_latent_norm = false;
  jax.router_score = RouterScore::Softmax;
  EXPECT_EQ(hf_unmappable(jax).size(), 3u);
  try {
    hf_config_json(jax, 0);
    FAIL() << "exported a model with no stock equivalent";
  } catch (const std::exception& e) {
    for (const char* part : {"mlp_activation 'gelu'", "mla_latent_norm false", "router_score 'softmax'"})
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  ModelConfig moe_mha = llama();
  moe_mha.ffn = FfnKind::Moe;
  moe_mha.n_experts = 4;
  EXPECT_EQ(hf_unmappable(moe_mha).size(), 1u);
  EXPECT_TRUE(hf_unmappable(llama()).empty());
}

TEST(HfMapping, ConfigFieldsMeshtrainCannotExpressAreListed) {
  nlohmann::json j = hf_config_json(llama(), 0);
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  j["rms_norm_eps"] = 1e-5;
  j["attention_bias"] = true;
  try {
    model_config_from_hf(j, ModelConfig{});
    FAIL() << "accepted rope scaling";
  } catch (const std::exception& e) {
    for (const char* part : {"rope_scaling", "rms_norm_eps", "attention_bias"})
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  j = hf_config_json(llama(), 0);
  j["model_type"] = "mistral";
  EXPECT_THROW(model_config_from_hf(j, ModelConfig{}), std::exception);
}

TEST(HfMapping, ShardSizes) {
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_shard_size("100kb"), 100'000);
  EXPECT_EQ(parse_shard_size("123"), 123);
  EXPECT_THROW(parse_shard_size("5 GiB"), std::exception);
  EXPECT_THROW(parse_shard_size("GB"), std::exception);
}

// ---------------------------------------------------------------- import accounting
// An HF directory written here (config.json + safetensors), then spoilt one
// way at a time: every tensor of the files must be one the architecture of
// config.json needs, with its shape and a floating-point dtype.

using Tensors = std::map<std::string, at::Tensor>;

Tensors hf_tensors_of(const ModelConfig& m) {
  const auto hf = to_hf_tensors(m, from(random_params(m)));
  return Tensors(hf.begin(), hf.end());
}

void write_hf_dir(const std::filesystem::path& dir, const ModelConfig& m, const Tensors& t) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << hf_config_json(m, 0).dump(2);
  write_safetensors((dir / "model.safetensors").string(), NamedTensors(t.begin(), t.end()));
}

// The import's error for dir ("" when it loads).
std::string import_error(const std::filesystem::path& dir) {
  return test::error_of([&] {
    const ModelConfig m = model_config_from_hf(
        nlohmann::json::parse(std::ifstream(dir / "config.json")), ModelConfig{});
    load_hf_model(dir.string(), m);
  });
}

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

TEST(HfImport, EveryTensorIsAccountedFor) {
  test::TempDir dir;
  for (const ModelConfig& m : {llama(), v3()}) {
    const Tensors good = hf_tensors_of(m);
    write_hf_dir(dir / "good", m, good);
    EXPECT_EQ(import_error(dir / "good"), "");
    const ModelConfig back = model_config_from_hf(hf_config_json(m, 0), ModelConfig{});
    EXPECT_EQ(load_hf_model((dir / "good").string(), back).size(), random_params(m).size());
    std::filesystem::remove_all(dir / "good");
  }
}

TEST(HfImport, LayersBeyondConfigAreRefusedNotDropped) {
  test::TempDir dir;
  const ModelConfig m = llama();
  Tensors t = hf_tensors_of(m);
  const int64_t L = m.n_layers();
  const std::string from_layer = "model.layers." + std::to_string(L - 1) + ".";
  const std::string to_layer = "model.layers." + std::to_string(L) + ".";
  Tensors extra;
  for (const auto& [name, v] : t)
    if (name.rfind(from_layer, 0) == 0) extra[to_layer + name.substr(from_layer.size())] = v;
  t.insert(extra.begin(), extra.end());
  write_hf_dir(dir / "hf", m, t);
  const std::string msg = import_error(dir / "hf");
  EXPECT_TRUE(has(msg, to_layer + "input_layernorm.weight (model.safetensors)") && has(msg, "not declared") &&
              has(msg, "num_hidden_layers " + std::to_string(L)))
      << msg;
}

TEST(HfImport, ExtraMissingShapeAndDtypeEachNameTheTensor) {
  test::TempDir dir;
  const ModelConfig m = llama();
  const Tensors good = hf_tensors_of(m);
  struct Case {
    std::string name, expect;
    std::function<void(Tensors&)> spoil;
  };
  const std::vector<Case> cases = {
      {"extra", "model.layers.0.self_attn.q_norm.weight (model.safetensors): extra tensor",
       [](Tensors& t) { t["model.layers.0.self_attn.q_norm.weight"] = at::ones({8}); }},
      {"missing", "model.norm.weight: missing", [](Tensors& t) { t.erase("model.norm.weight"); }},
      {"short embedding", "model.embed_tokens.weight (model.safetensors): shape [47, 32], config.json implies [50, 32]",
       [](Tensors& t) { t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"].narrow(0, 0, 47); }},
      {"long head", "lm_head.weight (model.safetensors): shape [64, 32]",
       [](Tensors& t) { t["lm_head.weight"] = at::randn({64, 32}); }},
      {"integer dtype", "model.layers.1.input_layernorm.weight (model.safetensors): dtype I32",
       [](Tensors& t) { t["model.layers.1.input_layernorm.weight"] = at::ones({32}, at::kInt); }},
      {"bool dtype", "model.layers.0.self_attn.k_proj.weight (model.safetensors): dtype BOOL",
       [](Tensors& t) { t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"].gt(0); }},
  };
  for (const auto& c : cases) {
    Tensors t = good;
    c.spoil(t);
    const auto d = dir / c.name;
    write_hf_dir(d, m, t);
    const std::string msg = import_error(d);
    EXPECT_TRUE(has(msg, c.expect) && has(msg, d.string())) << c.name << ": " << msg;
  }
  // Half-precision weights are fine.
  Tensors half = good;
  for (auto& [name, v] : half) v = v.to(at::kBFloat16);
  write_hf_dir(dir / "bf16", m, half);
  EXPECT_EQ(import_error(dir / "bf16"), "");
}

TEST(HfImport, ShardsAndTheIndexMustAgree) {
  test::TempDir dir;
  const ModelConfig m = llama();
  const Tensors good = hf_tensors_of(m);
  const auto d = dir / "hf";
  std::filesystem::create_directories(d);
  std::ofstream(d / "config.json") << hf_config_json(m, 0).dump(2);
  NamedTensors first, second;
  nlohmann::json map = nlohmann::json::object();
  size_t i = 0;
  for (const auto& [name, v] : good) {
    const bool one = i++ % 2 == 0;
    (one ? first : second).emplace_back(name, v);
    map[name] = one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  // A tensor in a shard that the index does not list would be ignored.
  second.emplace_back("model.layers.0.mlp.extra.weight", at::ones({4}));
  write_safetensors((d / "model-00001-of-00002.safetensors").string(), first);
  write_safetensors((d / "model-00002-of-00002.safetensors").string(), second);
  std::ofstream(d / "model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  std::string msg = import_error(d);
  EXPECT_TRUE(has(msg, "model.layers.0.mlp.extra.weight (model-00002-of-00002.safetensors): not listed")) << msg;
  second.pop_back();
  write_safetensors((d / "model-00002-of-00002.safetensors").string(), second);
  EXPECT_EQ(import_error(d), "");
  // So would a weights file the index does not name.
  write_safetensors((d / "model-00003-of-00003.safetensors").string(), {{"lm_head.weight", at::ones({2})}});
  msg = import_error(d);
  EXPECT_TRUE(has(msg, "model-00003-of-00003.safetensors") && has(msg, "does not name")) << msg;
}

TEST(HfImport, TiedModelMayStoreTheHeadOnlyAsACopy) {
  test::TempDir dir;
  ModelConfig m = llama();
  m.tie_embeddings = true;
  Tensors t = hf_tensors_of(m);
  ASSERT_FALSE(t.count("lm_head.weight"));
  t["lm_head.weight"] = t.at("model.embed_tokens.weight").clone();
  write_hf_dir(dir / "copy", m, t);
  EXPECT_EQ(import_error(dir / "copy"), "");
  t["lm_head.weight"] = at::randn_like(t.at("model.embed_tokens.weight"));
  write_hf_dir(dir / "other", m, t);
  const std::string msg = import_error(dir / "other");
  EXPECT_TRUE(has(msg, "lm_head.weight (model.safetensors)") && has(msg, "tie_word_embeddings")) << msg;
}

}  // namespace
}  // namespace meshtrain
