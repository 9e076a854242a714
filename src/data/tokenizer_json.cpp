// meshtrain's tokenizer.json: Tokenizer::save and Tokenizer::load. Version 2
// records the pre-tokenizer pattern and the special tokens with their ids;
// version 1 files (no pattern: they predate the regex pre-tokenizer) load
// with the GPT-2 pattern their hand-written rules approximated.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base64.h"
#include "bpe_tables.h"
#include "json_file.h"
#include "meshtrain/core/check.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {
namespace {

constexpr const char* kFormat = "meshtrain-tokenizer";
constexpr int kVersion = 2;

}  // namespace

void Tokenizer::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["kind"] = kind();
  j["pattern"] = pattern_;
  j["eot"] = eot_;
  j["vocab_size"] = vocab_size();
  nlohmann::json specials = nlohmann::json::array();
  for (const auto& [name, id] : specials_) specials.push_back({name, id});
  j["specials"] = std::move(specials);
  if (kind_ == Kind::kTrained) {
    // Bytes are ids 0..255 and merge i creates id 256 + i, so the merges are
    // the whole vocabulary.
    nlohmann::json merges = nlohmann::json::array();
    for (const auto& m : merges_) merges.push_back({m[0], m[1]});
    j["merges"] = std::move(merges);
  } else {
    // Token bytes by id ("" for special and unused ids); tiktoken's merges
    // follow from the tokens, HF's are listed in rank order.
    nlohmann::json tokens = nlohmann::json::array();
    std::vector<bool> special(tokens_.size(), false);
    for (const auto& s : specials_) special[static_cast<size_t>(s.second)] = true;
    for (size_t id = 0; id < tokens_.size(); ++id) {
      tokens.push_back(special[id] ? std::string() : detail::base64_encode(tokens_[id]));
    }
    j["tokens"] = std::move(tokens);
    if (kind_ == Kind::kHf) {
      nlohmann::json merges = nlohmann::json::array();
      for (const auto& m : merges_) merges.push_back({m[0], m[1]});
      j["merges"] = std::move(merges);
      j["whole_piece_lookup"] = whole_piece_lookup_;
    }
  }
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    MT_CHECK(out, "cannot write tokenizer file ", tmp);
    out << j.dump() << '\n';
    MT_CHECK(out.good(), "error writing tokenizer file ", tmp);
  }
  std::filesystem::rename(tmp, path);
}

Tokenizer Tokenizer::load(const std::string& path) {
  const nlohmann::json j = detail::read_json_file(path, "tokenizer file");
  if (j.is_object() && j.contains("model") && !j.contains("format")) return from_hf_json(path);
  MT_CHECK(j.is_object() && j.value("format", "") == kFormat, "tokenizer file ", path,
           " is neither meshtrain's (\"format\": \"", kFormat,
           "\") nor a Hugging Face tokenizer.json (a tiktoken file loads with --tokenizer x.tiktoken)");
  const int version = j.value("version", 0);
  MT_CHECK(version == 1 || version == 2, "tokenizer file ", path, " has version ", version,
           ", this build reads versions 1 and 2");
  Tokenizer tok;
  try {
    const std::string kind = j.at("kind").get<std::string>();
    tok.eot_ = j.at("eot").get<int32_t>();
    tok.pattern_ = version == 1 ? "gpt2" : j.at("pattern").get<std::string>();
    if (version == 1) {
      tok.specials_ = {{kEndOfText, tok.eot_}};
    } else {
      for (const auto& s : j.at("specials")) tok.specials_.emplace_back(s.at(0).get<std::string>(), s.at(1).get<int32_t>());
    }
    auto read_tokens = [&] {
      for (const auto& t : j.at("tokens")) {
        auto bytes = detail::base64_decode(t.get<std::string>());
        MT_CHECK(bytes, "tokenizer file ", path, ": bad base64 token ", t.dump());
        tok.tokens_.push_back(*bytes);
      }
    };
    auto read_pair = [&](const nlohmann::json& m, int32_t limit) {
      MT_CHECK(m.is_array() && m.size() == 2, "tokenizer file ", path, ": merge ", m.dump(), " is not a pair");
      auto l = m.at(0).get<int32_t>(), r = m.at(1).get<int32_t>();
      MT_CHECK(l >= 0 && r >= 0 && l < limit && r < limit, "tokenizer file ", path, ": merge ", m.dump(),
               " refers to ids outside 0..", limit - 1);
      return std::pair<int32_t, int32_t>(l, r);
    };
    if (kind == "bpe") {
      tok.kind_ = Kind::kTrained;
      for (int b = 0; b < 256; ++b) tok.tokens_.emplace_back(1, static_cast<char>(b));
      for (const auto& m : j.at("merges")) {
        auto next = static_cast<int32_t>(tok.tokens_.size());
        auto [l, r] = read_pair(m, next);
        tok.merges_.push_back({l, r, next});
        tok.tokens_.push_back(tok.tokens_[static_cast<size_t>(l)] + tok.tokens_[static_cast<size_t>(r)]);
      }
    } else if (kind == "tiktoken") {
      tok.kind_ = Kind::kTiktoken;
      tok.whole_piece_lookup_ = true;
      read_tokens();
      tok.merges_ = detail::merges_from_ranks(tok.tokens_);
    } else if (kind == "hf") {
      tok.kind_ = Kind::kHf;
      tok.whole_piece_lookup_ = j.at("whole_piece_lookup").get<bool>();
      read_tokens();
      std::unordered_map<std::string, int32_t> ids;
      for (size_t id = 0; id < tok.tokens_.size(); ++id) {
        if (!tok.tokens_[id].empty()) ids.emplace(tok.tokens_[id], static_cast<int32_t>(id));
      }
      const auto limit = static_cast<int32_t>(tok.tokens_.size());
      for (const auto& m : j.at("merges")) {
        auto [l, r] = read_pair(m, limit);
        auto merged = ids.find(tok.tokens_[static_cast<size_t>(l)] + tok.tokens_[static_cast<size_t>(r)]);
        MT_CHECK(merged != ids.end(), "tokenizer file ", path, ": merge ", m.dump(), " makes no token");
        tok.merges_.push_back({l, r, merged->second});
      }
    } else {
      MT_FAIL("tokenizer file ", path, ": unknown \"kind\": \"", kind, "\" (expected bpe, tiktoken or hf)");
    }
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL("tokenizer file ", path, " is malformed: ", e.what());
  }
  // Special tokens sit at their ids, past the ordinary ones or in gaps.
  for (const auto& [name, id] : tok.specials_) {
    MT_CHECK(id >= 0, "tokenizer file ", path, ": special token ", name, " has a negative id");
    if (static_cast<size_t>(id) >= tok.tokens_.size()) tok.tokens_.resize(static_cast<size_t>(id) + 1);
    tok.tokens_[static_cast<size_t>(id)] = name;
  }
  tok.finish(path);
  return tok;
}

Tokenizer load_tokenizer(const std::string& path, const std::string& pattern) {
  require_regular_file(path, "tokenizer file");
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot open tokenizer file ", path);
  char first = 0;
  in >> first;  // skips whitespace
  if (first != '{') return Tokenizer::from_tiktoken(path, pattern);
  MT_CHECK(pattern.empty(), "--pattern applies to tiktoken files only; ", path,
           " is a tokenizer.json that names its own pre-tokenizer");
  return Tokenizer::load(path);
}

}  // namespace meshtrain
