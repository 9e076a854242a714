// Which files a run reads (see data_sources.h).
#include "meshtrain/train/data_sources.h"

#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "../data/json_file.h"
#include "meshtrain/core/check.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

std::string data_folder(const Config& cfg, const std::string& sub) {
  const fs::path p = fs::path(cfg.data.data_dir) / sub;
  MT_CHECK(fs::is_directory(p), "data folder '", p.string(), "' does not exist (data_config.data_dir + ",
           sub == cfg.data.train_folder_name ? "train_folder_name" : "val_folder_name",
           "); create it with: meshtrain prepare-data --input <text files> --output ", cfg.data.data_dir);
  return p.string();
}

// nanoGPT keeps train.bin and val.bin side by side in data_dir.
std::string nanogpt_file(const Config& cfg, const std::string& name) {
  const fs::path p = fs::path(cfg.data.data_dir) / name;
  MT_CHECK(fs::is_regular_file(p), "data_config.format is \"nanogpt\" but ", p.string(),
           " does not exist (nanoGPT's prepare.py writes train.bin and val.bin into data_dir)");
  return p.string();
}

// data_config.datasets: each entry's training files (its train_folder_name
// shards, or nanoGPT's train.bin) with its weight.
std::vector<DataSource> blend_sources(const Config& cfg) {
  std::vector<DataSource> sources;
  for (const auto& ds : cfg.data.datasets) {
    DataSource src;
    src.weight = ds.weight;
    if (cfg.data.format == DataFormat::NanoGpt) {
      const fs::path p = fs::path(ds.path) / "train.bin";
      MT_CHECK(fs::is_regular_file(p), "data_config.datasets: ", p.string(), " does not exist");
      src.files = {p.string()};
      src.format = ShardFormat::kNanoGpt;
    } else {
      const fs::path p = fs::path(ds.path) / cfg.data.train_folder_name;
      MT_CHECK(fs::is_directory(p), "data_config.datasets: folder ", p.string(),
               " does not exist (prepare it with meshtrain prepare-data --output ", ds.path, ")");
      src.files = list_shards(p.string());
    }
    sources.push_back(std::move(src));
  }
  return sources;
}

}  // namespace

// Every dataset the run reads with its shard files, for the tokenizer check
// (data/data_tokenizer.h): the training data (data_dir or each blend member)
// and the validation data (data_dir).
std::vector<DatasetFiles> run_datasets(const Config& cfg) {
  if (cfg.data.format == DataFormat::NanoGpt && cfg.data.datasets.empty())
    return {{cfg.data.data_dir, {nanogpt_file(cfg, "train.bin"), nanogpt_file(cfg, "val.bin")}, ShardFormat::kNanoGpt}};
  std::vector<DatasetFiles> out;
  if (cfg.data.datasets.empty()) {
    DatasetFiles d{cfg.data.data_dir, list_shards(data_folder(cfg, cfg.data.train_folder_name)), ShardFormat::kLlmc};
    for (auto& f : list_shards(data_folder(cfg, cfg.data.val_folder_name))) d.files.push_back(std::move(f));
    out.push_back(std::move(d));
    return out;
  }
  const auto sources = blend_sources(cfg);
  for (size_t i = 0; i < sources.size(); ++i)
    out.push_back({cfg.data.datasets[i].path, sources[i].files, sources[i].format});
  out.push_back({cfg.data.data_dir, list_shards(data_folder(cfg, cfg.data.val_folder_name)), ShardFormat::kLlmc});
  return out;
}


RunLoaders make_loaders(const Config& cfg, int dp_rank, int dp) {
  const DataConfig& d = cfg.data;
  const int64_t vocab = cfg.model.vocab_size;
  RunLoaders l;
  if (!d.datasets.empty()) {
    l.train = std::make_unique<DataLoader>(blend_sources(cfg), d.T, d.train_batch_size, dp_rank, dp, vocab);
  } else if (d.format == DataFormat::NanoGpt) {
    l.train = std::make_unique<DataLoader>(std::vector<std::string>{nanogpt_file(cfg, "train.bin")},
                                           ShardFormat::kNanoGpt, d.T, d.train_batch_size, dp_rank, dp, vocab);
  } else {
    l.train = std::make_unique<DataLoader>(data_folder(cfg, d.train_folder_name), d.T, d.train_batch_size, dp_rank,
                                           dp, vocab);
  }
  // A blend validates on data_dir's own validation shards.
  if (d.format == DataFormat::NanoGpt && d.datasets.empty())
    l.val = std::make_unique<DataLoader>(std::vector<std::string>{nanogpt_file(cfg, "val.bin")},
                                         ShardFormat::kNanoGpt, d.T, d.val_batch_size, dp_rank, dp, vocab);
  else
    l.val = std::make_unique<DataLoader>(data_folder(cfg, d.val_folder_name), d.T, d.val_batch_size, dp_rank, dp,
                                         vocab);
  return l;
}

int64_t data_eot_token(const DataConfig& data) {
  const fs::path manifest = fs::path(data.data_dir) / "manifest.json", tok = fs::path(data.data_dir) / "tokenizer.json";
  if (fs::is_regular_file(manifest)) {
    const nlohmann::json j = detail::read_json_file(manifest.string(), "dataset manifest");
    if (j.contains("eot") && j.at("eot").is_number_integer() && j.at("eot").get<int64_t>() >= 0) {
      const int64_t eot = j.at("eot").get<int64_t>();
      const int64_t vocab = j.value("vocab_size", int64_t{0});
      MT_CHECK(vocab <= 0 || eot < vocab, "dataset manifest ", manifest.string(), ": \"eot\" ", eot,
               " is not a token of its vocabulary (\"vocab_size\" ", vocab, "), so document_masking would find no ",
               "document boundary; the manifest was edited or damaged: prepare the data again, or set ",
               "data_config.eot_token");
      return eot;
    }
  }
  if (fs::is_regular_file(tok)) {
    const int64_t eot = Tokenizer::load(tok.string()).eot();
    if (eot >= 0) return eot;
  }
  MT_FAIL("data_config.document_masking needs the end-of-text token that ends each document, but data_config.data_dir '",
          data.data_dir, "' has neither a manifest.json with \"eot\" nor a tokenizer.json with one: set "
          "data_config.eot_token");
}

}  // namespace meshtrain
