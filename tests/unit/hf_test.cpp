// The Hugging Face mapping without files or Python: every parameter of a built
// model maps to an HF tensor and back unchanged, the HF tensors have the
// shapes config.json implies, config.json reads back to the same model keys,
// and models without a stock equivalent are refused with every reason.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "meshtrain/hf/hf_dir.h"
#include "meshtrain/hf/hf_model.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {
namespace {

ModelConfig llama() {
  ModelConfig m;
  m.model_dimension = 32;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.vocab_size = 50;
  m.mlp_activation = "swiglu";
  m.tie_embeddings = false;
  return m;
}

ModelConfig v3() {
  ModelConfig m;
  m.model_dimension = 32;
  m.n_head = 4;
  m.vocab_size = 50;
  m.attention = "mla";
  m.latent_dim = 16;
  m.dhR = 4;
  m.mla_latent_norm = true;
  m.ffn = "moe";
  m.n_experts = 4;
  m.k = 2;
  m.n_shared = 1;
  m.mlp_hidden = 16;
  m.mlp_activation = "swiglu";
  m.router_score = "sigmoid";
  m.router_bias = true;
  m.routed_scaling_factor = 2.5;
  m.n_group = 2;
  m.first_k_dense = 1;
  m.dense_mlp_hidden = 24;
  m.mla_last_layer_no_rope = false;
  return m;
}

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
  EXPECT_EQ(again.swiglu(), m.swiglu());
}

TEST(HfMapping, LlamaRoundTrips) { expect_round_trip(llama()); }
TEST(HfMapping, DeepSeekV3RoundTrips) { expect_round_trip(v3()); }

TEST(HfMapping, GeluMlpBecomesLlamaMlpWithConstantUp) {
  ModelConfig m = llama();
  m.mlp_activation = "gelu";
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
  jax.mlp_activation = "gelu";
  jax.mla_latent_norm = false;
  jax.router_score = "softmax";
  EXPECT_EQ(hf_unmappable(jax).size(), 3u);
  try {
    hf_config_json(jax, 0);
    FAIL() << "exported a model with no stock equivalent";
  } catch (const std::exception& e) {
    for (const char* part : {"mlp_activation 'gelu'", "mla_latent_norm false", "router_score 'softmax'"})
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  ModelConfig moe_mha = llama();
  moe_mha.ffn = "moe";
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

}  // namespace
}  // namespace meshtrain
