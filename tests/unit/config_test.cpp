// Config loading: every key parsed, --set overrides, the JSON round trip,
// files that are not configs, the shipped configs and the key reference (the
// refusals of bad values: config_errors_test.cpp).
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_test_util.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/reference.h"
#include "meshtrain/config/resume.h"
#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

using namespace config_test;  // NOLINT(google-build-using-namespace): the shared helpers
namespace fs = std::filesystem;

// The Jaxformer moe1B config exactly as published (configs/jaxformer/moe1B.json).
const std::string kJaxformerMoe1b = std::string(MT_SOURCE_DIR) + "/configs/jaxformer/moe1B.json";

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// A value of the same JSON type as v, different from it; for a choice key
// (JSON pointer /section/key), the next of its names.
json changed_value(const std::string& pointer, const json& v) {
  for (const auto& [key, names] : kChoiceKeys) {
    std::string key_pointer = "/" + key;
    std::replace(key_pointer.begin(), key_pointer.end(), '.', '/');
    if (key_pointer != pointer) continue;
    const auto at = std::find(names.begin(), names.end(), v.get<std::string>());
    EXPECT_NE(at, names.end()) << pointer << " holds " << v.dump();
    return at == names.end() ? v : json(names[static_cast<size_t>(at - names.begin() + 1) % names.size()]);
  }
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number_unsigned()) return v.get<uint64_t>() + 7;
  if (v.is_number_integer()) return v.get<int64_t>() + 3;
  if (v.is_number_float()) return v.get<double>() + 0.5;
  if (v.is_string()) return v.get<std::string>() + "_x";
  ADD_FAILURE() << "unexpected leaf " << v.dump();
  return v;
}

TEST(ConfigJson, EveryKeyLandsInItsOwnMember) {
  // An empty array flattens to null (no leaf to change): give the list keys values.
  Config base;
  base.rampup_batch_size = {2, 2, 8};
  base.pipeline_pass_costs = {1, 1.5, 0.75};
  base.data.datasets = {{"data/a", 2.0}, {"data/b", 1.0}};
  const json flat = to_json(base).flatten();
  EXPECT_GE(flat.size(), 60u);
  // Change one key at a time: if it were not read, or shared a member with
  // another key, the converted config would differ from the JSON it came from.
  for (const auto& [pointer, value] : flat.items()) {
    SCOPED_TRACE(pointer);
    json changed = flat;
    changed[pointer] = changed_value(pointer, value);
    json expected = changed.unflatten();
    EXPECT_EQ(to_json(config_from_json(expected)), expected);
  }
  for (const auto& section :
       {"model_config", "data_config", "lr", "device_config", "inference_config", "seq_len_warmup"})
    EXPECT_TRUE(to_json(Config{}).at(section).is_object()) << section;
}

TEST(ConfigJson, DatasetsBlendAndDataFormat) {
  Config c = with({"data_config.format=nanogpt"});
  EXPECT_EQ(c.data.format, DataFormat::NanoGpt);
  json j = tiny_json();
  j["data_config"]["datasets"] = json::array({{{"path", "data/a"}, {"weight", 3}}, {{"path", "data/b"}}});
  Config b = config_from_json(j);
  ASSERT_EQ(b.data.datasets.size(), 2u);
  EXPECT_EQ(b.data.datasets[0].path, "data/a");
  EXPECT_EQ(b.data.datasets[0].weight, 3.0);
  EXPECT_EQ(b.data.datasets[1].weight, 1.0);
  j["data_config"]["datasets"] = json::array({{{"path", "data/a"}, {"wieght", 3}}});
  expect_error([&] { config_from_json(j); }, {"data_config.datasets[0]", "wieght"});
  j["data_config"]["datasets"] = json::array({{{"path", "data/a"}, {"weight", -1}}});
  expect_error([&] { validate(config_from_json(j)); }, {"data_config.datasets[0].weight", "positive"});
  j["data_config"]["datasets"] = "data/a";
  expect_error([&] { config_from_json(j); }, {"data_config.datasets"});
  expect_error([&] { with({"data_config.format=megatron"}); }, {"data_config.format", "nanogpt"});
}

TEST(ConfigJson, RoundTripKeepsEveryValue) {
  Config c = load_config(source_path("configs/tiny-moe-mla.json")).config;
  c.seed = 1234567890123ull;
  c.lr.max_lr = 1.0 / 3.0;
  c.device.n_device_axis = {2, 1, 2};
  c.inference.prompt = "line\n\"quoted\"";
  Config back = config_from_json(to_json(c));
  EXPECT_EQ(to_json(back), to_json(c));
  EXPECT_EQ(back.seed, c.seed);
  EXPECT_EQ(back.lr.max_lr, c.lr.max_lr);
  EXPECT_EQ(back.device.n_device_axis, c.device.n_device_axis);
  EXPECT_EQ(back.inference.prompt, c.inference.prompt);
  EXPECT_EQ(back.model.attention, AttentionKind::Mla);
  // Through text too, as a checkpoint stores it.
  EXPECT_EQ(to_json(config_from_json(json::parse(to_json(c).dump(2)))), to_json(c));
}

TEST(ConfigJson, MissingKeysKeepDefaults) {
  Config c = config_from_json(json::parse(R"({"model_config": {"n_head": 8}})"));
  Config d;
  EXPECT_EQ(c.model.n_head, 8);
  EXPECT_EQ(c.model.model_dimension, d.model.model_dimension);
  EXPECT_EQ(c.lr.max_lr, d.lr.max_lr);
  EXPECT_EQ(c.model.attention, AttentionKind::Mha);
  EXPECT_EQ(c.model.ffn, FfnKind::Dense);
  EXPECT_EQ(to_json(config_from_json(json::object())), to_json(d));
  validate(d);
}

TEST(ConfigFiles, ShippedConfigsLoadWithoutWarnings) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(source_path("configs"))) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    LoadedConfig lc = load_config(entry.path().string());
    EXPECT_TRUE(lc.warnings.empty()) << lc.warnings.front();
    ++n;
  }
  EXPECT_GE(n, 4);
}

TEST(ConfigFiles, TinyValues) {
  Config c = load_config(source_path("configs/tiny.json")).config;
  EXPECT_EQ(c.model.model_dimension, 64);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_layers(), 4);
  EXPECT_EQ(c.model.T, 32);
  EXPECT_EQ(c.model.vocab_size, 512);
  EXPECT_EQ(c.model.attention, AttentionKind::Mha);
  EXPECT_EQ(c.model.ffn, FfnKind::Dense);
  EXPECT_EQ(c.data.train_batch_size, 16);
  EXPECT_EQ(c.data.micro_batch_size, 4);
  EXPECT_DOUBLE_EQ(c.lr.max_lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.lr.end_lr, 3e-4);
  EXPECT_EQ(c.lr.warmup_steps, 10);
  EXPECT_EQ(c.training_steps, 200);
  EXPECT_EQ(c.checkpoint_steps, 50);
  EXPECT_EQ(c.data.data_dir, "data/fortunes");
  EXPECT_EQ(c.run_dir(), "runs/tiny");
  EXPECT_EQ(c.model.model_dtype, ModelDtype::Float32);
}

TEST(ConfigFiles, TinyMoeMlaValues) {
  Config c = load_config(source_path("configs/tiny-moe-mla.json")).config;
  EXPECT_EQ(c.model.attention, AttentionKind::Mla);
  EXPECT_EQ(c.model.latent_dim, 32);
  EXPECT_EQ(c.model.dhR, 8);
  EXPECT_EQ(c.model.ffn, FfnKind::Moe);
  EXPECT_EQ(c.model.n_experts, 4);
  EXPECT_EQ(c.model.k, 2);
  EXPECT_EQ(c.model.n_shared, 1);
  EXPECT_DOUBLE_EQ(c.model.capacity_factor, 1.5);
  EXPECT_EQ(c.model.mlp_hidden, 64);
  EXPECT_DOUBLE_EQ(c.alpha, 0.01);
  EXPECT_EQ(c.name, "tiny-moe-mla");
}

TEST(ConfigFiles, Gpt2Values) {
  Config c = load_config(source_path("configs/gpt2-124m.json")).config;
  EXPECT_EQ(c.model.n_layers(), 12);
  EXPECT_EQ(c.model.model_dimension, 768);
  EXPECT_EQ(c.model.n_head, 12);
  EXPECT_EQ(c.model.T, 1024);
  EXPECT_EQ(c.model.vocab_size, 50304);
  EXPECT_EQ(c.model.model_dtype, ModelDtype::Bfloat16);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.data.train_batch_size, 32);
  EXPECT_EQ(c.lr.warmup_steps, 700);
  EXPECT_EQ(c.lr.end_steps, 19000);
  EXPECT_DOUBLE_EQ(c.lr.weight_decay, 0.1);
}

void expect_moe1b_values(const Config& c) {
  EXPECT_EQ(c.model.model_dimension, 768);
  EXPECT_EQ(c.model.vocab_size, 100277);
  EXPECT_EQ(c.model.n_head, 12);
  EXPECT_EQ(c.model.blocks, 8);
  EXPECT_EQ(c.model.layers_per_block, 6);
  EXPECT_EQ(c.model.T, 1024);
  EXPECT_EQ(c.data.T, 1024);
  EXPECT_EQ(c.model.latent_dim, 128);
  EXPECT_EQ(c.model.dhR, 128);
  EXPECT_EQ(c.model.k, 2);
  EXPECT_EQ(c.model.n_experts, 16);
  EXPECT_EQ(c.model.n_shared, 2);
  EXPECT_DOUBLE_EQ(c.model.capacity_factor, 1.5);
  EXPECT_DOUBLE_EQ(c.model.dropout_rate, 0.2);
  EXPECT_EQ(c.model.model_dtype, ModelDtype::Bfloat16);
  EXPECT_EQ(c.device.n_device_axis, (std::array<int64_t, 3>{8, 2, 2}));
  EXPECT_EQ(c.device.world(), 32);
  EXPECT_EQ(c.data.train_batch_size, 32);
  EXPECT_EQ(c.data.val_batch_size, 16);
  EXPECT_EQ(c.data.micro_batch_size, 4);
  EXPECT_DOUBLE_EQ(c.lr.max_lr, 6e-4);
  EXPECT_DOUBLE_EQ(c.lr.min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.lr.end_lr, 6e-5);
  EXPECT_EQ(c.lr.warmup_steps, 5000);
  EXPECT_EQ(c.lr.end_steps, 75000);
  EXPECT_DOUBLE_EQ(c.grad_clip_norm, 1.0);
  EXPECT_DOUBLE_EQ(c.alpha, 1e-4);
  EXPECT_EQ(c.training_steps, 100000);
  EXPECT_EQ(c.checkpoint_steps, 75);
  EXPECT_EQ(c.eval_steps, 10);
  EXPECT_EQ(c.name, "moe1B");
  EXPECT_EQ(c.inference.top_k, 10000);
  EXPECT_EQ(c.inference.max_tokens, 10);
  validate_world(c, 32);
}

TEST(ConfigFiles, Moe1bLocalValues) {
  Config c = load_config(source_path("configs/moe1b.json")).config;
  expect_moe1b_values(c);
  EXPECT_EQ(c.model.attention, AttentionKind::Mla);
  EXPECT_EQ(c.model.ffn, FfnKind::Moe);
  EXPECT_EQ(c.output_dir, "runs");
  EXPECT_EQ(c.data.data_dir, "data/fortunes");
}

TEST(ConfigFiles, JaxformerMoe1bLoadsUnchangedWithWarnings) {
  ASSERT_TRUE(fs::exists(kJaxformerMoe1b)) << kJaxformerMoe1b << " is missing from the checkout";
  LoadedConfig lc = load_config(kJaxformerMoe1b);
  expect_moe1b_values(lc.config);
  // The file is in Jaxformer's layout (latent_dim, no attention/ffn keys): it
  // builds Jaxformer's MLA + MoE model (jaxformer_test checks the whole of it).
  EXPECT_EQ(lc.config.model.architecture, Architecture::Jaxformer);
  EXPECT_EQ(lc.config.model.attention, AttentionKind::Mla);
  EXPECT_EQ(lc.config.model.ffn, FfnKind::Moe);
  EXPECT_EQ(lc.config.output_dir, "runs/");
  EXPECT_EQ(lc.config.run_dir(), "runs/moe1B");
  EXPECT_EQ(lc.json.at("wandb"), true);  // the json is the file as written
  std::string all;
  for (const auto& w : lc.warnings) all += w + "\n";
  EXPECT_EQ(lc.warnings.size(), 5u) << all;
  for (const char* part : {"data_config.bucket_name", "data_config.data_dir", "data_config.process_path", "wandb",
                           "metrics.jsonl", "TensorBoard", "inference_config.n_devices", "gs://results_jaxformer/",
                           "'runs/'"})
    EXPECT_NE(all.find(part), std::string::npos) << part << " not in:\n" << all;
}

// Each name reads as its value and is written back as the same string, so a
// checkpoint's stored config (written before or after) compares equal on resume.
TEST(Config, EveryChoiceValueRoundTripsByName) {
  for (const auto& [key, names] : kChoiceKeys) {
    const auto dot = key.find('.');
    for (const auto& n : names) {
      json j = tiny_json();
      apply_override(j, key + "=" + n);
      const json back = to_json(config_from_json(j));
      const json& v = dot == std::string::npos ? back.at(key) : back.at(key.substr(0, dot)).at(key.substr(dot + 1));
      EXPECT_EQ(v, json(n)) << key;
    }
  }
}

TEST(ConfigOverrides, SetsNestedArraysStringsAndTopLevel) {
  json j = tiny_json();
  apply_override(j, "model_config.n_head=8");
  apply_override(j, "device_config.n_device_axis=[2,1,2]");
  apply_override(j, "model_config.model_dtype=bfloat16");
  apply_override(j, "lr.max_lr=1e-3");
  apply_override(j, "inference_config.use_cache=false");
  apply_override(j, "name=123");  // a string key takes the text, not the number
  apply_override(j, "inference_config.prompt=a b=c");
  apply_override(j, "seed=42");
  Config c = config_from_json(j);
  EXPECT_EQ(c.model.n_head, 8);
  EXPECT_EQ(c.device.n_device_axis, (std::array<int64_t, 3>{2, 1, 2}));
  EXPECT_EQ(c.model.model_dtype, ModelDtype::Bfloat16);
  EXPECT_DOUBLE_EQ(c.lr.max_lr, 1e-3);
  EXPECT_FALSE(c.inference.use_cache);
  EXPECT_EQ(c.name, "123");
  EXPECT_EQ(c.inference.prompt, "a b=c");
  EXPECT_EQ(c.seed, 42u);
}

TEST(ConfigOverrides, CreatesAbsentSection) {
  json j = json::object();
  apply_override(j, "lr.warmup_steps=5");
  EXPECT_EQ(config_from_json(j).lr.warmup_steps, 5);
}

TEST(ConfigOverrides, RefusesUnknownKeysAndBadSyntax) {
  json j = tiny_json();
  expect_error([&] { apply_override(j, "model_config.n_heads=4"); },
               {"unknown config key 'model_config.n_heads'", "model_config.n_head"});
  expect_error([&] { apply_override(j, "model_config.n_head.x=4"); }, {"model_config.n_head.x"});
  expect_error([&] { apply_override(j, "lr=4"); }, {"'lr' is a section"});
  expect_error([&] { apply_override(j, "model_config.n_head"); }, {"key=value"});
  // A value of the wrong type is caught when converting, naming the key.
  apply_override(j, "model_config.n_head=four");
  expect_error([&] { config_from_json(j); }, {"model_config.n_head", "integer", "four"});
}

TEST(ConfigLoad, OverridesAppliedThenValidated) {
  LoadedConfig lc = load_config(source_path("configs/tiny.json"), {"model_config.n_head=8", "seed=9"});
  EXPECT_EQ(lc.config.model.n_head, 8);
  EXPECT_EQ(lc.config.seed, 9u);
  EXPECT_EQ(lc.json["model_config"]["n_head"], 8);
  expect_error([&] { load_config(source_path("configs/tiny.json"), {"device_config.n_device_axis=[1,1,3]"}); },
               {"configs/tiny.json", "model_config.n_head (4)", "tp = 3"});
}

TEST(ConfigLoad, FileErrorsNameTheFile) {
  expect_error([] { load_config("/nonexistent/cfg.json"); }, {"/nonexistent/cfg.json", "does not exist"});
  std::string bad = write_temp("bad_config.json", "{\n  \"name\": \"x\",\n  \"seed\": ,\n}\n");
  expect_error([&] { load_config(bad); }, {bad, "not valid JSON", "line 3", "column 11"});
  std::string commented = write_temp("commented.json", "{\n  // a note\n  \"name\": \"c\"\n}\n");
  EXPECT_EQ(load_config(commented).config.name, "c");
}

TEST(ConfigLoad, DuplicateKeysAreRefusedNamingThePathAndFile) {
  const std::string nested = write_temp("dup_nested.json", R"({"model_config": {"n_head": 4, "n_head": 2}})");
  expect_error([&] { load_config(nested); }, {nested, "key 'model_config.n_head' is given twice"});
  const std::string top = write_temp("dup_top.json", R"({"name": "a", "seed": 1, "name": "b"})");
  expect_error([&] { load_config(top); }, {top, "key 'name' is given twice"});
  // The same key in two different objects is fine.
  const std::string apart = write_temp("dup_apart.json",
                                       R"({"model_config": {"T": 64}, "data_config": {"T": 64}, "name": "a"})");
  EXPECT_EQ(load_config(apart).config.name, "a");
}

// Issue 47: files and values that crashed or were silently wrong.
TEST(ConfigLoad, DeepNestingIsRefusedBeforeAnyCopy) {
  // ~200,000 levels crashed (stack overflow) when the parsed config was copied.
  const std::string deep = write_temp("deep.json", "{\"model_config\": " + std::string(200000, '[') +
                                                       std::string(200000, ']') + "}");
  expect_error([&] { load_config(deep); }, {deep, "nests values more than 64 levels deep", "model_config"});
  const std::string deep_top = write_temp("deep_top.json", std::string(100000, '[') + std::string(100000, ']'));
  expect_error([&] { load_config(deep_top); }, {deep_top, "nests values more than"});
  expect_error([&] { with({"rampup_batch_size=" + std::string(100, '[') + std::string(100, ']')}); },
               {"--set 'rampup_batch_size=", "nests more than 64 levels deep"});
}

TEST(ConfigLoad, NotAnObjectIsBlamedOnTheFile) {
  // Was blamed on an unrelated --set ("the config is not a JSON object").
  const std::string array = write_temp("array.json", "[{\"name\": \"x\"}]");
  expect_error([&] { load_config(array, {"training_steps=3"}); }, {array, "holds a JSON array, not an object"});
  const std::string number = write_temp("number.json", "42");
  expect_error([&] { load_config(number); }, {number, "holds a JSON number"});
}

TEST(ConfigLoad, CloudOutputDirMapsToLocalRuns) {
  json j = tiny_json();
  j["output_dir"] = "gs://bucket/x";
  std::vector<std::string> warnings;
  Config c = config_from_json(j, &warnings);
  EXPECT_EQ(c.output_dir, "runs/");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("gs://bucket/x"), std::string::npos);
  EXPECT_NE(warnings[0].find("'runs/'"), std::string::npos);
  j["data_config"]["bucket_name"] = "b";
  warnings.clear();
  config_from_json(j, &warnings);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("data is read from local data_config.data_dir"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

TEST(ConfigCollectives, AcceptsAutoNcclMpiAndRefusesTheRest) {
  EXPECT_EQ(with({}).device.collectives, CollectivesChoice::Auto);
  EXPECT_EQ(with({"device_config.collectives=mpi"}).device.collectives, CollectivesChoice::Mpi);
  EXPECT_EQ(with({"device_config.collectives=nccl"}).device.collectives, CollectivesChoice::Nccl);
  expect_refused({"device_config.collectives=gloo"}, {"device_config.collectives", "gloo"});
  expect_refused({"device_config.device=cpu", "device_config.collectives=nccl"},
                 {"device_config.collectives", "nccl", "cpu"});
  expect_refused({"device_config.collectives=3"}, {"device_config.collectives"});
}

// Every key the schema writes, as dotted paths (sections are the JSON objects).
std::vector<std::string> schema_paths() {
  std::vector<std::string> paths;
  const nlohmann::json written = to_json(Config{});  // items() refers to it: not a temporary
  for (const auto& [name, value] : written.items()) {
    if (!value.is_object()) {
      paths.push_back(name);
      continue;
    }
    for (const auto& item : value.items()) paths.push_back(name + "." + item.key());
  }
  return paths;
}

// docs/config-reference.md is generated; each key needs words of its own
// (src/config/key_docs.cpp), and no description outlives its key.
TEST(ConfigReference, EveryKeyHasADescriptionAndEveryDescriptionAKey) {
  const auto paths = schema_paths();
  ASSERT_GT(paths.size(), 100u);
  for (const auto& p : paths) {
    const std::string_view text = key_description(p);
    EXPECT_FALSE(text.empty()) << p << " has no description in src/config/key_docs.cpp";
    EXPECT_GE(text.size(), 20u) << p << ": a description says what the key means, its unit and range";
  }
  std::set<std::string> seen;
  for (const auto& d : key_docs()) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), d.path), paths.end())
        << d.path << " is described in src/config/key_docs.cpp but is no config key";
    EXPECT_TRUE(seen.insert(d.path).second) << d.path << " is described twice";
  }
}

TEST(ConfigReference, RendersEveryKeyWithItsDefaultAllowedValuesAndResumeRule) {
  const std::string md = render_config_reference();
  for (const auto& p : schema_paths()) {
    const std::string key = p.substr(p.find('.') == std::string::npos ? 0 : p.find('.') + 1);
    EXPECT_NE(md.find("| `" + key + "` |"), std::string::npos) << p << " has no row";
  }
  // A choice lists its names; a default comes from a default-built Config.
  EXPECT_NE(md.find("| `activation_checkpointing` | string | `\"none\"` | `none`, `full`, `selective` | free |"),
            std::string::npos);
  EXPECT_NE(md.find("| `n_head` | integer | `4` |  | refused |"), std::string::npos);
  EXPECT_NE(md.find("| `dropout_rate` | number | `0.0` |  | warns |"), std::string::npos);
  EXPECT_NE(md.find("`data_config.bucket_name`"), std::string::npos);  // the cloud keys too
  EXPECT_EQ(resume_change("model_config.n_head"), ResumeChange::Refused);
  EXPECT_EQ(resume_change("lr.max_lr"), ResumeChange::Free);
  EXPECT_EQ(resume_change("seed"), ResumeChange::Warned);
  // FP8 changes the GEMMs, not the parameters: a resume may switch recipes, and says so.
  EXPECT_EQ(resume_change("model_config.fp8_recipe"), ResumeChange::Warned);
}

}  // namespace
}  // namespace meshtrain
