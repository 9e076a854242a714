// Facts about parameters are recorded where the model creates them (the
// LayerFactory's ParamLayout), for parallelize and the training loop to read:
// every parameter has a layout; the sequence-shard readers (partial gradients
// under sequence parallelism), the routed experts and the router score biases
// are exactly the ones the model's structure says.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/config/load.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {
namespace {

// From JSON as a user writes it: the test does not depend on how Config
// stores its choices.
ModelConfig model(const nlohmann::json& extra) {
  nlohmann::json m = {{"model_dimension", 16}, {"vocab_size", 37}, {"n_head", 4}, {"blocks", 1},
                      {"layers_per_block", 2}, {"T", 8}, {"mlp_hidden", 24}, {"linear_bias", true},
                      {"norm_bias", true}};
  m.update(extra);
  return config_from_json({{"model_config", m}}).model;
}

std::set<std::string> tagged(const LayerFactory& f, bool ParamLayout::*fact) {
  std::set<std::string> out;
  for (const auto& [path, layout] : f.layouts())
    if (layout.*fact) out.insert(path);
  return out;
}

// The RMSNorms' parameters, found by module type, not by name.
std::set<std::string> norm_params(Transformer& m) {
  std::set<std::string> out;
  for (const auto& item : m.named_modules("", /*include_self=*/false)) {
    if (!dynamic_cast<RMSNorm*>(item.value().get())) continue;
    for (const auto& p : item.value()->named_parameters()) out.insert(item.key() + "." + p.key());
  }
  return out;
}

void expect_every_parameter_has_a_layout(Transformer& m, const LayerFactory& f) {
  for (const auto& p : m.named_parameters())
    EXPECT_TRUE(f.layouts().count(p.key())) << p.key() << " was created outside the LayerFactory";
}

TEST(ParamFacts, DenseMhaSequenceShardReadersAreNormsAndRowBiases) {
  const ModelConfig c = model({{"attention", "mha"}, {"ffn", "dense"}});
  LayerFactory f;
  Transformer m(c, f);
  expect_every_parameter_has_a_layout(m, f);
  std::set<std::string> want = norm_params(m);
  EXPECT_EQ(want.size(), 2u * 4 + 2);  // attn/mlp norms' weight and bias in 2 layers, and the final norm's
  for (const std::string l : {"layers.0.", "layers.1."})
    for (const char* bias : {"attn.wo.bias", "mlp.w_out.bias"}) want.insert(l + bias);
  EXPECT_EQ(tagged(f, &ParamLayout::reads_sequence_shard), want);
  EXPECT_TRUE(tagged(f, &ParamLayout::expert_split).empty());
  EXPECT_TRUE(tagged(f, &ParamLayout::router_score_bias).empty());
}

TEST(ParamFacts, MlaDownProjectionsAndLatentNormsReadTheShard) {
  const ModelConfig c = model({{"attention", "mla"}, {"ffn", "dense"}, {"latent_dim", 8}, {"dhR", 4},
                               {"mla_latent_norm", true}});
  LayerFactory f;
  Transformer m(c, f);
  expect_every_parameter_has_a_layout(m, f);
  std::set<std::string> want = norm_params(m);
  EXPECT_EQ(want.size(), 2u * 6 + 2);  // and each layer's q_norm/kv_norm weights
  for (const std::string l : {"layers.0.", "layers.1."}) {
    for (const char* bias : {"attn.wo.bias", "mlp.w_out.bias"}) want.insert(l + bias);
    for (const char* rep : {"attn.w_dkv", "attn.w_dq"})
      for (const char* p : {".weight", ".bias"}) want.insert(l + rep + p);
  }
  // The shared rope key, in the layers that have one.
  for (int64_t i = 0; i < c.n_layers(); ++i)
    if (mla_layer_dhR(c, i) > 0)
      for (const char* p : {".weight", ".bias"}) want.insert("layers." + std::to_string(i) + ".attn.w_kr" + p);
  ASSERT_TRUE(f.layouts().count("layers.0.attn.w_kr.weight"));
  EXPECT_EQ(tagged(f, &ParamLayout::reads_sequence_shard), want);
}

TEST(ParamFacts, MoeRouterReadsGatheredSequenceAndScoreBiasIsTagged) {
  const ModelConfig c = model({{"attention", "mha"}, {"ffn", "moe"}, {"n_experts", 4}, {"k", 2}, {"n_shared", 1},
                               {"shared_expert", "linear"}, {"router_bias", true}, {"mlp_activation", "swiglu"}});
  LayerFactory f;
  Transformer m(c, f);
  expect_every_parameter_has_a_layout(m, f);
  std::set<std::string> shard = tagged(f, &ParamLayout::reads_sequence_shard);
  std::set<std::string> experts, biases;
  for (int64_t i = 0; i < c.n_layers(); ++i) {
    if (!is_moe_layer(c, i)) continue;
    const std::string l = "layers." + std::to_string(i) + ".moe.";
    // The router and Jaxformer's shared projection read the gathered sequence:
    // their gradient is whole on every tp rank, never summed again.
    for (const char* rep : {"router.weight", "router.bias", "shared_proj.weight", "shared_proj.bias"}) {
      ASSERT_TRUE(f.layouts().count(l + rep)) << l + rep;
      EXPECT_FALSE(shard.count(l + rep)) << l + rep;
    }
    for (const char* e : {"experts.w_in", "experts.w_out", "experts.w_gate", "experts.b_in"}) experts.insert(l + e);
    biases.insert(l + "score_bias");
  }
  ASSERT_FALSE(biases.empty());
  EXPECT_EQ(tagged(f, &ParamLayout::expert_split), experts);  // b_out is added outside the experts' region
  EXPECT_EQ(tagged(f, &ParamLayout::router_score_bias), biases);
  // The score bias has no gradient: only the balancing rule moves it.
  for (const auto& p : m.named_parameters())
    if (biases.count(p.key())) EXPECT_FALSE(p.value().requires_grad()) << p.key();
}

}  // namespace
}  // namespace meshtrain
