// Hugging Face model directories on disk: export from a checkpoint, read for import.
#include "meshtrain/hf/hf_dir.h"

#include <torch/torch.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/export_guard.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/json_read.h"
#include "meshtrain/core/paths.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/hf/hf_model.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  f.close();
  MT_CHECK(f.good(), "cannot write ", path.string());
}

nlohmann::json read_json(const fs::path& path) {
  require_regular_file(path.string(), "file");
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "cannot read ", path.string());
  std::ostringstream text;
  text << f.rdbuf();
  return parse_json_text(text.str(), "file", path.string());
}

// Consecutive tensors into shards of at most max_bytes (a tensor larger than
// that gets a shard of its own), as transformers' split_torch_state_dict_into_shards.
void write_weights(const fs::path& dir, const NamedTensors& tensors, int64_t max_bytes) {
  std::vector<NamedTensors> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    if (in_shard > 0 && in_shard + bytes > max_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace_back(name, t);
    in_shard += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors((dir / "model.safetensors").string(), shards[0], metadata);
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    write_safetensors((dir / file).string(), shards[s], metadata);
    for (const auto& [name, t] : shards[s]) weight_map[name] = file;
  }
  write_json(dir / "model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
}

}  // namespace

int64_t parse_shard_size(const std::string& text) {
  size_t end = 0;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  MT_CHECK(end > 0, "--max-shard-size '", text, "' must be a number of bytes, optionally with KB, MB or GB");
  std::string unit = text.substr(end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, int64_t> scale = {{"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000000},
                                                {"GB", 1000000000}};
  const auto it = scale.find(unit);
  MT_CHECK(it != scale.end(), "--max-shard-size '", text, "': unknown unit '", unit, "' (use KB, MB or GB)");
  // Digits past int64 (or a product past it) would wrap or throw std::stoll's bare "stoll".
  int64_t n = 0;
  for (size_t i = 0; i < end; ++i) {
    MT_CHECK(n <= (std::numeric_limits<int64_t>::max() - 9) / 10, "--max-shard-size '", text,
             "' is too large (at most ", std::numeric_limits<int64_t>::max(), " bytes)");
    n = n * 10 + (text[i] - '0');
  }
  MT_CHECK(n <= std::numeric_limits<int64_t>::max() / it->second, "--max-shard-size '", text,
           "' is too large (at most ", std::numeric_limits<int64_t>::max(), " bytes)");
  n *= it->second;
  MT_CHECK(n > 0, "--max-shard-size must be > 0, got '", text, "'");
  return n;
}

void export_hf(const std::string& ckpt_dir, const std::string& out_dir, const HfExportOptions& opts) {
  const CheckpointReader reader(ckpt_dir);
  const auto& state = reader.trainer_state();
  MT_CHECK(state.contains("config"), "checkpoint ", ckpt_dir, " has no config in trainer_state.json");
  const Config cfg = config_from_json(state.at("config"));
  // Where it would write comes first: a refused --output is a user's mistake
  // whatever the model is.
  const std::string tok_path = opts.tokenizer.empty() ? cfg.data.data_dir + "/tokenizer.json" : opts.tokenizer;
  check_export_output(ckpt_dir, out_dir, /*dir_output=*/true, {tok_path});
  const auto why = hf_unmappable(cfg.model);
  if (!why.empty()) {
    std::string list;
    for (const auto& w : why) list += "\n  - " + w;
    MT_FAIL("checkpoint ", ckpt_dir, ": this model has no exact stock Hugging Face equivalent, so it is not exported "
            "(never approximately). What does not map:", list);
  }
  MT_CHECK(opts.max_shard_bytes > 0, "max shard size must be > 0");
  MT_CHECK(fs::exists(tok_path), "tokenizer ", tok_path, " not found (the run's data_config.data_dir/tokenizer.json; "
           "pass --tokenizer FILE)");
  const Tokenizer tok = Tokenizer::load(tok_path);
  MT_CHECK(tok.vocab_size() <= cfg.model.vocab_size, "tokenizer ", tok_path, " has ", tok.vocab_size(),
           " tokens, more than the model's vocab_size ", cfg.model.vocab_size);

  const NamedTensors tensors = to_hf_tensors(cfg.model, [&](const std::string& name) {
    MT_CHECK(reader.has("model." + name), "checkpoint ", ckpt_dir, " has no tensor 'model.", name, "'");
    return reader.read("model." + name);
  });

  // Everything goes into a sibling temporary directory, renamed when complete.
  const fs::path out = fs::absolute(out_dir);
  const fs::path tmp = out.parent_path() / (out.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write_weights(tmp, tensors, opts.max_shard_bytes);
    write_json(tmp / "config.json", hf_config_json(cfg.model, tok.eot()));
    write_json(tmp / "generation_config.json",
               {{"bos_token_id", tok.eot()}, {"eos_token_id", tok.eot()}, {"_from_model_config", true}});
    std::ofstream f(tmp / "tokenizer.json");
    f << to_hf_tokenizer_json(tok);
    f.close();
    MT_CHECK(f.good(), "cannot write ", (tmp / "tokenizer.json").string());
    if (fs::exists(out)) fs::remove(out);  // empty (checked above)
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  MT_CHECK(fs::is_directory(dir), "--init-from-hf ", dir, " is not a directory");
  config_ = read_json(fs::path(dir) / "config.json");
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const nlohmann::json j = read_json(index);
    MT_CHECK(j.contains("weight_map") && j.at("weight_map").is_object(), index.string(), " has no weight_map");
    for (const auto& [name, file] : j.at("weight_map").items()) file_of_[name] = file.get<std::string>();
  } else {
    const fs::path single = fs::path(dir) / "model.safetensors";
    MT_CHECK(fs::exists(single), dir, " has neither model.safetensors nor model.safetensors.index.json "
             "(only safetensors weights are read, not pytorch_model.bin)");
    files_.emplace("model.safetensors", read_safetensors(single.string()));
    for (const auto& name : files_.at("model.safetensors").names()) file_of_[name] = "model.safetensors";
  }
  for (const auto& [name, file] : file_of_) {
    if (files_.count(file)) continue;
    files_.emplace(file, read_safetensors((fs::path(dir) / file).string()));
  }
}

at::Tensor HfCheckpoint::tensor(const std::string& name) const {
  const auto it = file_of_.find(name);
  MT_CHECK(it != file_of_.end(), "Hugging Face model ", dir_, " has no tensor '", name, "'");
  const SafetensorsFile& f = files_.at(it->second);
  MT_CHECK(f.has(name), dir_, "/", it->second, " lacks tensor '", name, "' listed in its index");
  return f.get(name);
}

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Older Llama checkpoints saved RoPE's inverse frequencies as buffers; they
// follow from rope_theta and are not weights (transformers skips them too).
bool is_rotary_buffer(const std::string& name) {
  const std::string tail = ".rotary_emb.inv_freq";
  return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// For an extra tensor under model.layers.N: the layer config.json does not declare.
std::string undeclared_layer(const std::string& name, int64_t n_layers) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return "";
  const size_t end = name.find('.', prefix.size());
  const std::string digits = name.substr(prefix.size(), end == std::string::npos ? std::string::npos : end - prefix.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return "";
  const int64_t i = std::stoll(digits);
  if (i < n_layers) return "";
  return " (layer " + digits + " is not declared: config.json has num_hidden_layers " + std::to_string(n_layers) + ")";
}

}  // namespace

void HfCheckpoint::check_tensors(const ModelConfig& m) const {
  const auto shapes = hf_tensor_shapes(m);
  const std::map<std::string, std::vector<int64_t>> expected(shapes.begin(), shapes.end());
  std::vector<std::string> problems;
  std::set<std::string> present;
  for (const auto& [file, f] : files_) {
    for (const auto& name : f.names()) {
      const std::string at = name + " (" + file + ")";
      const auto listed = file_of_.find(name);
      if (listed == file_of_.end() || listed->second != file) {
        problems.push_back(at + ": not listed for this file in model.safetensors.index.json");
        continue;
      }
      present.insert(name);
      if (is_rotary_buffer(name)) continue;
      if (name == "lm_head.weight" && m.tie_embeddings) continue;  // checked below
      const auto it = expected.find(name);
      if (it == expected.end()) {
        problems.push_back(at + ": extra tensor, not part of the " + hf_model_type(m) + " model config.json describes" +
                           undeclared_layer(name, m.n_layers()));
        continue;
      }
      const at::ScalarType dtype = f.dtype(name);
      if (!at::isFloatingType(dtype))
        problems.push_back(at + ": dtype " + safetensors_dtype_name(dtype) +
                           ", weights must be floating point (F32, F16, BF16, F64)");
      if (f.shape(name) != it->second)
        problems.push_back(at + ": shape " + shape_text(f.shape(name)) + ", config.json implies " +
                           shape_text(it->second));
    }
  }
  for (const auto& [name, file] : file_of_)
    if (!present.count(name) && files_.count(file) && !files_.at(file).has(name))
      problems.push_back(name + " (" + file + "): listed in model.safetensors.index.json but absent from the file");
  for (const auto& [name, shape] : shapes)
    if (!file_of_.count(name)) problems.push_back(name + ": missing (config.json implies it, shape " + shape_text(shape) + ")");
  // A tied model may still store lm_head: only as a copy of the embedding.
  if (m.tie_embeddings && file_of_.count("lm_head.weight") && present.count("lm_head.weight") &&
      problems.empty()) {
    const at::Tensor head = tensor("lm_head.weight"), embed = tensor("model.embed_tokens.weight");
    if (!head.sizes().equals(embed.sizes()) || !at::equal(head.to(at::kFloat), embed.to(at::kFloat)))
      problems.push_back("lm_head.weight (" + file_of_.at("lm_head.weight") +
                         "): differs from model.embed_tokens.weight, but config.json ties them "
                         "(tie_word_embeddings true), so it would be ignored");
  }
  // Weights in a file the index does not name would be ignored.
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string file = entry.path().filename().string();
    if (entry.path().extension() == ".safetensors" && !files_.count(file))
      problems.push_back(file + ": a weights file that " +
                         (fs::exists(fs::path(dir_) / "model.safetensors.index.json") ? "model.safetensors.index.json"
                                                                                       : "this directory's layout") +
                         " does not name (its tensors would be ignored)");
  }
  if (problems.empty()) return;
  constexpr size_t kShown = 30;
  std::string list;
  for (size_t i = 0; i < problems.size() && i < kShown; ++i) list += "\n  " + problems[i];
  if (problems.size() > kShown) list += "\n  ... and " + std::to_string(problems.size() - kShown) + " more";
  MT_FAIL("Hugging Face model ", dir_, ": its tensors do not match its config.json (", problems.size(),
          " problem(s); every tensor must be one the architecture needs, with its shape and a floating-point dtype):",
          list);
}

Config with_hf_model(Config cfg, const std::string& dir) {
  MT_CHECK(fs::is_directory(dir), "--init-from-hf ", dir, " is not a directory");
  cfg.model = model_config_from_hf(read_json(fs::path(dir) / "config.json"), cfg.model);
  validate(cfg);
  HfCheckpoint(dir).check_tensors(cfg.model);  // before any work, on headers only
  return cfg;
}

Config with_checkpoint_hf_model(Config cfg, const std::string& checkpoint, std::string* hf_dir, std::string* from) {
  std::vector<std::string> dirs = checkpoint.empty() ? list_checkpoints(cfg.run_dir()) : std::vector{checkpoint};
  for (const auto& dir : dirs) {
    const fs::path state = fs::path(dir) / "trainer_state.json";
    if (!fs::is_regular_file(state)) continue;  // incomplete: the resume skips it too
    std::ifstream in(state);
    const nlohmann::json st = nlohmann::json::parse(in, nullptr, false);
    if (!st.is_object()) continue;
    if (!st.contains("init_from_hf") || !st["init_from_hf"].is_string() || !st.contains("config")) return cfg;
    const Config saved = config_from_json(st["config"]);
    ModelConfig m = saved.model;
    m.T = cfg.model.T;
    m.dropout_rate = cfg.model.dropout_rate;
    m.model_dtype = cfg.model.model_dtype;
    m.fp8_recipe = cfg.model.fp8_recipe;
    m.capacity_factor = cfg.model.capacity_factor;
    m.router_z_loss = cfg.model.router_z_loss;
    m.init_std = cfg.model.init_std;
    cfg.model = m;
    validate(cfg);
    *hf_dir = st["init_from_hf"].get<std::string>();
    *from = dir;
    return cfg;
  }
  return cfg;
}

std::map<std::string, at::Tensor> load_hf_model(const std::string& dir, const ModelConfig& m) {
  const HfCheckpoint hf(dir);
  hf.check_tensors(m);
  auto tensors = from_hf_tensors(m, [&](const std::string& name) {
    at::Tensor t = hf.tensor(name).to(at::kFloat);
    // NaN or inf weights would train as a run of skipped steps, never named.
    if (t.numel() > 0 && !at::isfinite(t).all().item<bool>())
      MT_FAIL("Hugging Face model ", dir, ": tensor '", name, "' holds NaN or inf (",
              t.numel() - at::isfinite(t).sum().item<int64_t>(), " of ", t.numel(), " values); meshtrain starts ",
              "only from finite weights");
    return t;
  });
  return tensors;
}

}  // namespace meshtrain
