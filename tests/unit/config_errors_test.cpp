// Config refusals: every kind of bad value, type and combination is refused
// with the key named (and the value or limit), before anything runs.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_test_util.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

using namespace config_test;  // NOLINT(google-build-using-namespace): the shared helpers

TEST(ConfigErrors, UnknownKeys) {
  json j = tiny_json();
  j["model_config"]["n_heads"] = 4;
  expect_error([&] { config_from_json(j); },
               {"unknown config key 'model_config.n_heads'", "did you mean 'model_config.n_head'"});
  j = tiny_json();
  j["T"] = 32;  // right key, wrong section
  expect_error([&] { config_from_json(j); }, {"unknown config key 'T'", "did you mean '", ".T'"});
  j = tiny_json();
  j["lr"]["zzz_unrelated"] = 1;
  expect_error([&] { config_from_json(j); }, {"unknown config key 'lr.zzz_unrelated'"});
  j = tiny_json();
  j["model_config"] = 5;
  expect_error([&] { config_from_json(j); }, {"model_config", "object", "number"});
  expect_error([&] { config_from_json(json::array()); }, {"JSON object"});
}

TEST(ConfigErrors, WrongTypesNameKeyExpectedAndFound) {
  json j = tiny_json();
  j["model_config"]["n_head"] = "4";
  expect_error([&] { config_from_json(j); }, {"model_config.n_head", "integer", "string"});
  j = tiny_json();
  j["inference_config"]["use_cache"] = 1;
  expect_error([&] { config_from_json(j); }, {"inference_config.use_cache", "boolean", "number"});
  j = tiny_json();
  j["inference_config"]["stop_at_eot"] = "no";
  expect_error([&] { config_from_json(j); }, {"inference_config.stop_at_eot", "boolean", "string"});
  j = tiny_json();
  EXPECT_TRUE(config_from_json(j).inference.stop_at_eot);  // samples end at end-of-text by default
  j["inference_config"]["stop_at_eot"] = false;
  EXPECT_FALSE(config_from_json(j).inference.stop_at_eot);
  j = tiny_json();
  j["name"] = 7;
  expect_error([&] { config_from_json(j); }, {"'name'", "string", "number"});
  j = tiny_json();
  j["lr"]["max_lr"] = "0.1";
  expect_error([&] { config_from_json(j); }, {"lr.max_lr", "number", "string"});
  j = tiny_json();
  j["device_config"]["n_device_axis"] = {1, 2};
  expect_error([&] { config_from_json(j); }, {"device_config.n_device_axis", "3 integers"});
  j = tiny_json();
  j["device_config"]["n_device_axis"] = {1, 2, "x"};
  expect_error([&] { config_from_json(j); }, {"device_config.n_device_axis[2]", "string"});
  j = tiny_json();
  j["wandb"] = "yes";
  expect_error([&] { config_from_json(j); }, {"wandb", "boolean", "string"});
  j = tiny_json();
  j["seed"] = nullptr;
  expect_error([&] { config_from_json(j); }, {"seed", "null"});
}

TEST(ConfigErrors, IntegersMustBeIntegral) {
  json j = tiny_json();
  j["model_config"]["n_head"] = 1.5;
  expect_error([&] { config_from_json(j); }, {"model_config.n_head", "integer", "1.5"});
  j["model_config"]["n_head"] = 4.0;  // a whole number written as a float is fine
  EXPECT_EQ(config_from_json(j).model.n_head, 4);
  j = tiny_json();
  j["seed"] = -1;
  expect_error([&] { config_from_json(j); }, {"seed", "non-negative integer"});
  j = tiny_json();
  j["device_config"]["n_device_axis"] = {1, 1.5, 1};
  expect_error([&] { config_from_json(j); }, {"n_device_axis[1]"});
  j = tiny_json();
  j["training_steps"] = 1e30;
  expect_error([&] { config_from_json(j); }, {"training_steps", "integer"});
}

// device_config.cuda_graphs: what a captured step cannot replay is refused at
// start-up, naming the key that asks for it.
TEST(ConfigErrors, CudaGraphsRefuseWhatAGraphCannotReplay) {
  const std::string on = "device_config.cuda_graphs=true";
  EXPECT_TRUE(with({on}).device.cuda_graphs);
  expect_refused({on, "device_config.n_device_axis=[2,1,1]"}, {"device_config.cuda_graphs", "one rank", "2"});
  expect_refused({on, "rampup_batch_size=[4,4,64]"}, {"device_config.cuda_graphs", "rampup_batch_size"});
  expect_refused({on, "seq_len_warmup.total_curriculum_step=10", "seq_len_warmup.min_difficulty=8",
                  "seq_len_warmup.difficulty_step=8"},
                 {"device_config.cuda_graphs", "seq_len_warmup"});
  const std::string moe = "model_config.ffn=moe", experts = "model_config.n_experts=4", k = "model_config.k=2";
  expect_refused({on, moe, experts, k, "model_config.capacity_factor=0"},
                 {"device_config.cuda_graphs", "dropless", "model_config.capacity_factor"});
  EXPECT_NO_THROW(with({on, moe, experts, k, "model_config.capacity_factor=1.25"}));
  expect_refused({on, "activation_checkpointing=full"}, {"device_config.cuda_graphs", "activation_checkpointing"});
  expect_refused({on, "data_config.document_masking=true"}, {"device_config.cuda_graphs", "document_masking"});
}

// FP8 recipes: on top of bf16 only, and on the meshes where every rank's
// scales are one process's; each refusal names the keys that conflict.
TEST(ConfigErrors, Fp8Recipes) {
  const std::string bf16 = "model_config.model_dtype=bfloat16";
  for (const char* r : {"tensorwise", "rowwise", "blockwise"}) {
    const std::string recipe = std::string("model_config.fp8_recipe=") + r;
    expect_refused({recipe}, {"model_config.fp8_recipe", r, "model_config.model_dtype", "bfloat16", "float32"});
    EXPECT_EQ(with({bf16, recipe}).model.fp8_recipe, parse_choice<Fp8Recipe>(r).value());
  }
  EXPECT_EQ(with({}).model.fp8_recipe, Fp8Recipe::None);
  const std::string block = "model_config.fp8_recipe=blockwise", tensor = "model_config.fp8_recipe=tensorwise";
  const std::string moe = "model_config.ffn=moe", experts = "model_config.n_experts=4";
  // cp and ep together: refused for every recipe.
  expect_refused({bf16, tensor, moe, experts, "device_config.n_device_axis=[2,1,1]", "device_config.context_parallel=2",
                  "device_config.expert_parallel=2"},
                 {"model_config.fp8_recipe", "device_config.context_parallel", "device_config.expert_parallel"});
  EXPECT_NO_THROW(with({bf16, tensor, "device_config.context_parallel=2"}));
  expect_refused({bf16, block, "device_config.context_parallel=2"},
                 {"model_config.fp8_recipe \"blockwise\"", "device_config.context_parallel"});
  // Blockwise under tp: shards of whole 128-wide tiles (the default model is 64 wide).
  expect_refused({bf16, block, "device_config.n_device_axis=[1,1,2]"},
                 {"model_config.fp8_recipe \"blockwise\"", "tp = 2", "device_config.n_device_axis[2]", "32", "128"});
  const std::string wide = "model_config.model_dimension=256";
  EXPECT_NO_THROW(with({bf16, block, wide, "device_config.n_device_axis=[1,1,2]"}));
  expect_refused({bf16, block, wide, "device_config.n_device_axis=[1,1,2]", "model_config.mlp_hidden=384"},
                 {"model_config.dense_mlp_hidden", "384", "192"});
  // ... and under sequence parallelism a replicated layer's sequence shard too (MLA's down-projections).
  const std::vector<std::string> mla = {bf16, block, wide, "device_config.n_device_axis=[1,1,2]",
                                        "model_config.attention=mla", "model_config.latent_dim=64",
                                        "sequence_parallel=true"};
  std::vector<std::string> short_t = mla;
  short_t.push_back("model_config.T=128");
  short_t.push_back("data_config.T=128");
  expect_refused(short_t, {"model_config.fp8_recipe \"blockwise\"", "sequence_parallel", "model_config.T", "256"});
  std::vector<std::string> long_t = mla;
  long_t.push_back("model_config.T=256");
  long_t.push_back("data_config.T=256");
  EXPECT_NO_THROW(with(long_t));
  // Blockwise on one rank: any width (the last tile of a row or column is partial).
  EXPECT_NO_THROW(with({bf16, block, "model_config.model_dimension=48"}));
}

TEST(ConfigErrors, BadEnums) {
  expect_refused({"model_config.attention=gqa"}, {"model_config.attention", "mha, mla", "gqa"});
  expect_refused({"model_config.ffn=sparse"}, {"model_config.ffn", "dense, moe"});
  expect_refused({"model_config.model_dtype=float16"}, {"model_config.model_dtype", "float32, bfloat16"});
  expect_refused({"model_config.router_score=relu"}, {"model_config.router_score"});
  expect_refused({"pipeline_schedule=zb"}, {"pipeline_schedule", "gpipe, 1f1b, interleaved"});
  expect_refused({"activation_checkpointing=some"}, {"activation_checkpointing"});
  expect_refused({"nan_policy=ignore"}, {"nan_policy"});
  expect_refused({"zero_stage=4"}, {"zero_stage"});
  expect_refused({"fsdp_keep_gathered=true"}, {"fsdp_keep_gathered", "zero_stage 2 or 3"});
  expect_refused({"device_config.device=tpu"}, {"device_config.device"});
}

TEST(ConfigErrors, EveryChoiceKeyRefusesAnUnknownValueNamingTheAllowedOnes) {
  for (const auto& [key, names] : kChoiceKeys) {
    std::string allowed;
    for (const auto& n : names) allowed += (allowed.empty() ? "" : ", ") + n;
    expect_refused({key + "=bogus"}, {key + " must be one of {" + allowed + "}, got 'bogus'"});
    // Names are exact: no case folding.
    std::string upper = names.front();
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    expect_refused({key + "=" + upper}, {key, allowed, upper});
  }
}

// tiny.json: 4 layers, 16 sequences in microbatches of 4.
TEST(ConfigErrors, InterleavedPipeline) {
  const std::string pp2 = "device_config.n_device_axis=[1,2,1]", il = "pipeline_schedule=interleaved";
  EXPECT_NO_THROW(with({pp2, il, "virtual_stages=2"}));
  EXPECT_NO_THROW(with({il, "virtual_stages=2"}));  // pp 1 runs no schedule
  expect_refused({il, "virtual_stages=0"}, {"virtual_stages", ">= 1"});
  expect_refused({pp2, "virtual_stages=2"}, {"virtual_stages=2", "pipeline_schedule \"interleaved\""});
  expect_refused({pp2, il, "virtual_stages=3"}, {"4 layers", "multiple of pp * virtual_stages", "2 * 3"});
  expect_refused({pp2, il, "virtual_stages=2", "data_config.micro_batch_size=16"},
                 {"interleaved", "microbatches per round", "multiple of pp = 2", "micro_batch_size = 16", "makes 1"});
  expect_refused({pp2, il, "virtual_stages=2", "rampup_batch_size=[4,4,64]"},
                 {"interleaved", "a batch of 4 sequences", "multiple of pp = 2"});
}

// tiny.json: 4 layers. zbv's V cuts them into 2pp chunks; neither schedule
// takes interleaved's virtual_stages beyond its own chunk count.
TEST(ConfigErrors, ZeroBubblePipeline) {
  const std::string pp2 = "device_config.n_device_axis=[1,2,1]", pp4 = "device_config.n_device_axis=[1,4,1]";
  EXPECT_NO_THROW(with({pp2, "pipeline_schedule=zb-h1"}));
  EXPECT_NO_THROW(with({pp4, "pipeline_schedule=zb-h1"}));
  EXPECT_NO_THROW(with({pp2, "pipeline_schedule=zbv"}));
  EXPECT_NO_THROW(with({pp2, "pipeline_schedule=zbv", "virtual_stages=2"}));
  EXPECT_NO_THROW(with({pp2, "pipeline_schedule=zbv", "zero_stage=3"}));  // FSDP reduces a layer after its W
  EXPECT_NO_THROW(with({"pipeline_schedule=zbv", "model_config.blocks=3"}));  // pp 1 runs no schedule
  expect_refused({pp4, "pipeline_schedule=zbv"},
                 {"pipeline_schedule \"zbv\"", "4 layers", "model_config.blocks", "multiple of 2 * pp = 8"});
  expect_refused({pp2, "pipeline_schedule=zbv", "virtual_stages=4"},
                 {"pipeline_schedule \"zbv\"", "virtual_stages", "got 4"});
  expect_refused({pp2, "pipeline_schedule=zb-h1", "virtual_stages=2"},
                 {"pipeline_schedule \"zb-h1\"", "virtual_stages at 1", "got 2"});
  // The passes' lengths the plans are made with: [forward, B, W].
  EXPECT_EQ(with({pp2, "pipeline_schedule=zbv", "pipeline_pass_costs=[1, 1.2, 0.7]"}).pipeline_pass_costs,
            (std::vector<double>{1, 1.2, 0.7}));
  expect_refused({pp2, "pipeline_schedule=zbv", "pipeline_pass_costs=[1, 0.7]"},
                 {"pipeline_pass_costs", "[forward, B, W]", "got 2"});
  expect_refused({pp2, "pipeline_schedule=zbv", "pipeline_pass_costs=[1, 0, 0.7]"},
                 {"pipeline_pass_costs[1]", "positive", "got 0"});
  expect_refused({pp2, "pipeline_pass_costs=[1, -1, 0.7]"}, {"pipeline_pass_costs[1]", "got -1"});
  expect_refused({pp2, "pipeline_pass_costs=\"fast\""}, {"pipeline_pass_costs", "an array of numbers"});
}

TEST(ConfigErrors, BadValues) {
  expect_refused({"model_config.model_dimension=0"}, {"model_config.model_dimension", ">= 1"});
  expect_refused({"model_config.n_head=3"}, {"model_config.model_dimension", "model_config.n_head", "divisible"});
  expect_refused({"model_config.n_head=64"}, {"head dim", "even"});
  expect_refused({"model_config.dropout_rate=1.0"}, {"model_config.dropout_rate", "[0, 1)"});
  expect_refused({"lr.min_lr=0.1"}, {"lr.min_lr", "lr.max_lr"});
  expect_refused({"lr.end_lr=0.1"}, {"lr.end_lr", "lr.max_lr"});
  expect_refused({"lr.warmup_steps=-1"}, {"lr.warmup_steps"});
  expect_refused({"lr.beta2=1"}, {"lr.beta2"});
  expect_refused({"grad_step=0"}, {"grad_step", ">= 1"});
  expect_refused({"checkpoint_steps=0"}, {"checkpoint_steps"});
  expect_refused({"max_to_keep=0"}, {"max_to_keep"});
  expect_refused({"grad_clip_norm=-1"}, {"grad_clip_norm"});
  expect_refused({"training_steps=-1"}, {"training_steps"});
  expect_refused({"inference_config.batch_size=0"}, {"inference_config.batch_size"});
  expect_refused({"inference_config.temperature=-0.5"}, {"inference_config.temperature"});
  expect_refused({"inference_config.top_k=-1"}, {"inference_config.top_k"});
  expect_refused({"device_config.n_device_axis=[1,0,1]"}, {"device_config.n_device_axis", ">= 1"});
}

TEST(ConfigErrors, BadCombinations) {
  expect_refused({"data_config.T=64"}, {"model_config.T (32)", "data_config.T (64)"});
  expect_refused({"device_config.n_device_axis=[1,1,3]", "model_config.mlp_hidden=96"},
                 {"model_config.n_head (4)", "tp = 3"});
  expect_refused({"device_config.n_device_axis=[3,1,1]"}, {"data_config.train_batch_size (16)", "dp = 3"});
  expect_refused({"device_config.n_device_axis=[2,1,1]", "data_config.val_batch_size=3"},
                 {"data_config.val_batch_size (3)", "dp = 2"});
  expect_refused({"device_config.n_device_axis=[4,1,1]", "data_config.micro_batch_size=3"},
                 {"data_config.micro_batch_size (3)", "16 / 4 = 4"});
  expect_refused({"device_config.n_device_axis=[1,5,1]"}, {"n_device_axis: pp=5 exceeds", "4 layers"});
  expect_refused({"device_config.n_device_axis=[1,1,2]", "sequence_parallel=true", "model_config.T=31",
                  "data_config.T=31"},
                 {"sequence_parallel", "model_config.T (31)", "tp = 2"});
  expect_refused({"model_config.attention=mla"}, {"model_config.latent_dim", "mla"});
  expect_refused({"model_config.attention=mla", "model_config.latent_dim=16", "model_config.dhR=3"},
                 {"model_config.dhR", "even"});
  expect_refused({"model_config.ffn=moe"}, {"model_config.n_experts", "moe"});
  expect_refused({"model_config.ffn=moe", "model_config.n_experts=2", "model_config.k=3"},
                 {"model_config.k", "n_experts = 2"});
  expect_refused({"model_config.ffn=moe", "model_config.n_experts=2", "model_config.capacity_factor=-1"},
                 {"model_config.capacity_factor", ">= 0"});
  with({"model_config.ffn=moe", "model_config.n_experts=2", "model_config.capacity_factor=0"});  // dropless
  // expert_parallel divides dp and n_experts, and needs an MoE model.
  expect_refused({"device_config.n_device_axis=[4,1,1]", "device_config.expert_parallel=3", "model_config.ffn=moe",
                  "model_config.n_experts=6"},
                 {"device_config.expert_parallel (3)", "dp = 4"});
  expect_refused({"device_config.n_device_axis=[4,1,1]", "device_config.expert_parallel=4", "model_config.ffn=moe",
                  "model_config.n_experts=6"},
                 {"device_config.expert_parallel (4)", "model_config.n_experts (6)"});
  expect_refused({"device_config.n_device_axis=[2,1,1]", "device_config.expert_parallel=2"},
                 {"device_config.expert_parallel = 2", "MoE"});
  expect_refused({"device_config.expert_parallel=0"}, {"device_config.expert_parallel", ">= 1"});
  with({"device_config.n_device_axis=[4,1,1]", "device_config.expert_parallel=2", "model_config.ffn=moe",
        "model_config.n_experts=6"});
  // Llama / DeepSeek-V3 options.
  expect_refused({"model_config.ffn=moe", "model_config.n_experts=4", "model_config.router_bias_update_rate=0.001"},
                 {"model_config.router_bias_update_rate", "router_bias"});
  expect_refused({"model_config.mlp_activation=relu"}, {"model_config.mlp_activation", "gelu, swiglu", "relu"});
  expect_refused({"model_config.n_kv_head=3"}, {"model_config.n_head (4)", "model_config.n_kv_head (3)"});
  expect_refused({"model_config.n_kv_head=4", "device_config.n_device_axis=[1,1,4]", "model_config.n_head=8",
                  "model_config.n_kv_head=8", "model_config.model_dimension=48", "model_config.n_head=12",
                  "model_config.n_kv_head=6"},
                 {"model_config.n_kv_head (6)", "tp = 4"});
  expect_refused({"model_config.mla_latent_norm=true"}, {"model_config.mla_latent_norm", "mla"});
  expect_refused({"model_config.first_k_dense=1"}, {"model_config.first_k_dense", "moe"});
  expect_refused({"model_config.router_bias=true"}, {"router_bias", "moe"});
  const std::vector<std::string> moe = {"model_config.ffn=moe", "model_config.n_experts=4", "model_config.k=2"};
  auto plus = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), moe.begin(), moe.end());
    return extra;
  };
  expect_refused(plus({"model_config.n_group=3"}), {"model_config.n_experts (4)", "model_config.n_group (3)"});
  expect_refused(plus({"model_config.n_group=4"}), {"model_config.n_group (4)", "two best"});
  expect_refused(plus({"model_config.n_group=2", "model_config.topk_group=3"}), {"model_config.topk_group"});
  expect_refused(plus({"model_config.n_group=2", "model_config.topk_group=1", "model_config.k=3"}),
                 {"model_config.k (3)", "topk_group (1)"});
  expect_refused(plus({"model_config.routed_scaling_factor=0"}), {"model_config.routed_scaling_factor"});
  expect_refused(plus({"model_config.first_k_dense=5"}), {"model_config.first_k_dense (5)", "4 layers"});
  with(plus({"model_config.n_group=2", "model_config.topk_group=1", "model_config.first_k_dense=1",
             "model_config.router_bias=true", "model_config.mlp_activation=swiglu"}));
  // Fewer kv heads than tp ranks: replicated.
  with({"model_config.n_kv_head=1", "device_config.n_device_axis=[1,1,2]"});
  // And the good combinations pass.
  with({"device_config.n_device_axis=[2,2,2]"});
  with({"device_config.n_device_axis=[4,1,1]", "data_config.micro_batch_size=2"});
  with({"device_config.n_device_axis=[1,1,2]", "sequence_parallel=true"});
}

TEST(ConfigErrors, WorldSizeMustMatchMesh) {
  Config c = with({"device_config.n_device_axis=[2,1,2]"});
  validate_world(c, 4);
  expect_error([&] { validate_world(c, 8); }, {"[2, 1, 2] = 4 ranks", "mpirun started 8"});
}

// Issue 28: settings that were silently wrong or escaped their folder.
TEST(ConfigErrors, RunNameIsOneFolderInsideOutputDir) {
  for (const std::string bad : {"../../x", "..", ".", "/abs/run", "a/b", "x/.."})
    expect_refused({"name=" + bad}, {"name (--name) must be a single folder name", bad});
  EXPECT_EQ(with({"name=ok name.v2"}).run_dir(), "runs/ok name.v2");
  EXPECT_EQ(with({"name=..x", "output_dir=../elsewhere"}).run_dir(), "../elsewhere/..x");  // output_dir as given
}

TEST(ConfigErrors, WarmupLongerThanTheScheduleIsRefused) {
  expect_refused({"lr.warmup_steps=50", "lr.end_steps=40"}, {"lr.warmup_steps (50)", "lr.end_steps (40)"});
  EXPECT_EQ(with({"lr.warmup_steps=40", "lr.end_steps=40"}).lr.warmup_steps, 40);
  EXPECT_EQ(with({"lr.warmup_steps=0", "lr.end_steps=0"}).lr.end_steps, 0);
}

TEST(ConfigErrors, TokenIdsOutsideTheVocabulary) {
  // document_masking looked for an end-of-text id no token can have: masking did nothing.
  expect_refused({"data_config.document_masking=true", "data_config.eot_token=320", "model_config.vocab_size=320"},
                 {"data_config.eot_token (320) must be below model_config.vocab_size (320)"});
  EXPECT_EQ(with({"data_config.eot_token=319", "model_config.vocab_size=320"}).data.eot_token, 319);
  // Token ids are 32-bit: 3e9 passed and failed in the allocator.
  expect_refused({"model_config.vocab_size=3000000000"}, {"model_config.vocab_size (3000000000) must be <= 2147483648"});
}

}  // namespace
}  // namespace meshtrain
