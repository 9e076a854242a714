#include "meshtrain/data/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer.h"

namespace fs = std::filesystem;

namespace meshtrain {
namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot read input file ", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Like git: a NUL byte near the start marks a binary file.
bool looks_binary(const std::string& text) {
  return text.substr(0, 8000).find('\0') != std::string::npos;
}

bool is_blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// Fisher-Yates with raw mt19937_64 draws: std::shuffle and the standard
// distributions differ between standard libraries, the engine does not.
void shuffle_documents(std::vector<std::string>& docs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = docs.size(); i > 1; --i) std::swap(docs[i - 1], docs[rng() % i]);
}

// Balanced shards of at most shard_tokens each: no tiny tail shard that a
// loader with a large batch would refuse.
std::vector<std::string> write_split(const fs::path& folder, const std::string& name,
                                     const std::vector<int32_t>& tokens, int64_t shard_tokens, int version) {
  fs::create_directories(folder);
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t n_shards = std::max<int64_t>(1, (total + shard_tokens - 1) / shard_tokens);
  std::vector<std::string> names;
  for (int64_t s = 0; s < n_shards; ++s) {
    int64_t begin = total * s / n_shards, end = total * (s + 1) / n_shards;
    char file[64];
    std::snprintf(file, sizeof(file), "%s_%06lld.bin", name.c_str(), static_cast<long long>(s));
    write_shard((folder / file).string(),
                std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + end), version);
    names.emplace_back(file);
  }
  return names;
}

std::vector<int32_t> tokenize(const Tokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<int32_t> out;
  for (const auto& doc : docs) {
    auto ids = tok.encode(doc);
    out.insert(out.end(), ids.begin(), ids.end());
    out.push_back(tok.eot());
  }
  return out;
}

// output_dir may be replaced only when it is empty or an earlier prepare-data
// result; anything else might be the user's own folder.
void check_replaceable(const fs::path& out) {
  if (!fs::exists(out)) return;
  MT_CHECK(fs::is_directory(out) && (fs::is_empty(out) || fs::exists(out / "manifest.json")), "output folder ",
           out.string(), " exists and is not an earlier prepare-data output; choose another --output");
}

}  // namespace

std::vector<std::string> collect_input_files(const std::vector<std::string>& inputs) {
  MT_CHECK(!inputs.empty(), "prepare-data: no --input given");
  std::vector<fs::path> candidates;
  for (const auto& input : inputs) {
    fs::path p(input);
    MT_CHECK(fs::exists(p), "prepare-data: input ", input, " does not exist");
    if (fs::is_directory(p)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(p)) {
        if (e.is_regular_file()) found.push_back(e.path());
      }
      std::sort(found.begin(), found.end());
      candidates.insert(candidates.end(), found.begin(), found.end());
    } else {
      candidates.push_back(p);
    }
  }
  // A link is dropped when its target is listed too (fortune's art.u8 -> art),
  // whichever of the two sorts first; a repeated real file is dropped as well.
  std::set<fs::path> real;
  for (const auto& p : candidates) {
    if (!fs::is_symlink(p)) real.insert(fs::canonical(p));
  }
  std::vector<std::string> files;
  std::set<fs::path> seen;
  for (const auto& p : candidates) {
    if (p.extension() == ".dat") continue;  // fortune's binary index files
    const fs::path target = fs::canonical(p);
    if (fs::is_symlink(p) && real.count(target)) continue;
    if (!seen.insert(target).second) continue;
    files.push_back(p.string());
  }
  return files;
}

std::vector<std::string> split_documents(const std::string& text) {
  std::vector<std::string> docs;
  std::string current;
  std::istringstream in(text);
  std::string line;
  auto flush = [&] {
    if (!is_blank(current)) docs.push_back(current);
    current.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%" || line == "%\r") {
      flush();
    } else {
      current += line;
      current += '\n';
    }
  }
  flush();
  return docs;
}

std::string to_string(const PrepareSummary& s) {
  std::ostringstream os;
  os << "prepare-data: " << s.files << " files (" << s.skipped_binary_files << " binary skipped), "
     << s.train_documents + s.val_documents << " documents (" << s.train_documents << " train, " << s.val_documents
     << " val), " << s.train_tokens << " train / " << s.val_tokens << " val tokens, vocab " << s.vocab_size << ", "
     << std::fixed << std::setprecision(1) << s.seconds << " s -> " << s.output_dir;
  return os.str();
}

PrepareSummary prepare_data(const PrepareOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  MT_CHECK(!opt.output_dir.empty(), "prepare-data: --output is required");
  MT_CHECK((opt.vocab_size > 0) != !opt.tokenizer_file.empty(),
           "prepare-data: give exactly one of --vocab-size (train a tokenizer) and --tokenizer (a tiktoken file)");
  MT_CHECK(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0, "prepare-data: --val-fraction must be in [0, 1), got ",
           opt.val_fraction);
  MT_CHECK(opt.shard_tokens > 0, "prepare-data: shard_tokens must be positive, got ", opt.shard_tokens);
  fs::path out = fs::absolute(opt.output_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" names dir
  check_replaceable(out);

  std::vector<std::string> docs;
  int64_t skipped = 0;
  const auto files = collect_input_files(opt.inputs);
  for (const auto& f : files) {
    std::string text = read_file(f);
    if (looks_binary(text)) {
      ++skipped;
      continue;
    }
    for (auto& d : split_documents(text)) docs.push_back(std::move(d));
  }
  MT_CHECK(docs.size() >= 2, "prepare-data: inputs hold ", docs.size(),
           " documents; need at least 2 (one for train, one for val)");
  shuffle_documents(docs, opt.seed);
  auto n_val = std::max<size_t>(1, static_cast<size_t>(opt.val_fraction * static_cast<double>(docs.size()) + 0.5));
  n_val = std::min(n_val, docs.size() - 1);
  std::vector<std::string> val(docs.end() - static_cast<std::ptrdiff_t>(n_val), docs.end());
  docs.resize(docs.size() - n_val);
  const std::vector<std::string>& train = docs;

  Tokenizer tok = opt.vocab_size > 0 ? Tokenizer::train(train, opt.vocab_size, opt.pattern.empty() ? "gpt2" : opt.pattern)
                                     : load_tokenizer(opt.tokenizer_file, opt.pattern);
  const int version = tok.vocab_size() <= 65536 ? 1 : 2;
  const auto train_tokens = tokenize(tok, train);
  const auto val_tokens = tokenize(tok, val);

  fs::path tmp = out.parent_path() / (out.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  try {
    fs::create_directories(tmp);
    tok.save((tmp / "tokenizer.json").string());
    auto train_shards = write_split(tmp / "train", "train", train_tokens, opt.shard_tokens, version);
    auto val_shards = write_split(tmp / "val", "val", val_tokens, opt.shard_tokens, version);
    nlohmann::json manifest = {
        {"format", "meshtrain-data"},
        {"version", 1},
        {"tokenizer", "tokenizer.json"},
        {"vocab_size", tok.vocab_size()},
        {"eot", tok.eot()},
        {"shard_version", version},
        {"seed", opt.seed},
        {"val_fraction", opt.val_fraction},
        {"inputs", opt.inputs},
        {"files", files.size() - static_cast<size_t>(skipped)},
        {"train", {{"documents", train.size()}, {"tokens", train_tokens.size()}, {"shards", train_shards}}},
        {"val", {{"documents", val.size()}, {"tokens", val_tokens.size()}, {"shards", val_shards}}},
    };
    {
      std::ofstream m(tmp / "manifest.json");
      MT_CHECK(m, "cannot write ", (tmp / "manifest.json").string());
      m << manifest.dump(2) << '\n';
      MT_CHECK(m.good(), "error writing ", (tmp / "manifest.json").string());
    }
    fs::remove_all(out);
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  PrepareSummary summary;
  summary.files = static_cast<int64_t>(files.size());
  summary.skipped_binary_files = skipped;
  summary.train_documents = static_cast<int64_t>(train.size());
  summary.val_documents = static_cast<int64_t>(val.size());
  summary.train_tokens = static_cast<int64_t>(train_tokens.size());
  summary.val_tokens = static_cast<int64_t>(val_tokens.size());
  summary.vocab_size = tok.vocab_size();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.output_dir = out.string();
  return summary;
}

}  // namespace meshtrain
