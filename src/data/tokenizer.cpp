// Encoding, decoding and the two file formats of Tokenizer; training lives in
// bpe_train.cpp.
#include "meshtrain/data/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base64.h"
#include "meshtrain/core/check.h"
#include "pretokenize.h"

namespace meshtrain {
namespace {

constexpr const char* kFormat = "meshtrain-tokenizer";
constexpr int kVersion = 1;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

void Tokenizer::add_merge(int32_t left, int32_t right, int32_t merged) {
  merges_.emplace(pair_key(left, right), merged);
}

void Tokenizer::derive_rank_merges() {
  std::unordered_map<std::string, int32_t> ids;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (!tokens_[id].empty()) ids.emplace(tokens_[id], static_cast<int32_t>(id));
  }
  // A pair may merge exactly when its concatenation is a token, with that
  // token's rank as priority; list every split of every token once.
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    for (size_t k = 1; k < t.size(); ++k) {
      auto left = ids.find(t.substr(0, k));
      if (left == ids.end()) continue;
      auto right = ids.find(t.substr(k));
      if (right != ids.end()) add_merge(left->second, right->second, static_cast<int32_t>(id));
    }
  }
}

void Tokenizer::finish_byte_table(const std::string& source) {
  byte_ids_.fill(-1);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (static_cast<int32_t>(id) != eot_ && tokens_[id].size() == 1) {
      byte_ids_[static_cast<unsigned char>(tokens_[id][0])] = static_cast<int32_t>(id);
    }
  }
  MT_CHECK(eot_ >= 0 && eot_ == static_cast<int32_t>(tokens_.size()) - 1,
           source, ": end-of-text must be the last token id");
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  MT_CHECK(id >= 0 && id < static_cast<int32_t>(tokens_.size()), "token id ", id,
           " is outside the vocabulary of ", tokens_.size());
  return tokens_[static_cast<size_t>(id)];
}

std::vector<int32_t> Tokenizer::encode_piece(const std::string& piece) const {
  std::vector<int32_t> ids;
  ids.reserve(piece.size());
  for (char c : piece) {
    int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    MT_CHECK(id >= 0, "tokenizer has no token for byte 0x", std::hex,
             static_cast<int>(static_cast<unsigned char>(c)), " (its vocabulary lacks single-byte tokens)");
    ids.push_back(id);
  }
  // Apply the earliest merge present until none applies; merging every
  // occurrence of that pair left to right matches how training merged it.
  while (ids.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max();
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      auto it = merges_.find(pair_key(ids[i], ids[i + 1]));
      if (it != merges_.end() && it->second < best) {
        best = it->second;
        best_key = it->first;
      }
    }
    if (best == std::numeric_limits<int32_t>::max()) break;
    size_t out = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + 1 < ids.size() && pair_key(ids[i], ids[i + 1]) == best_key) {
        ids[out++] = best;
        ++i;
      } else {
        ids[out++] = ids[i];
      }
    }
    ids.resize(out);
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  // Natural text repeats its words; remembering them per call keeps encoding
  // a corpus linear without shared mutable state in the tokenizer.
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  for (std::string_view piece : detail::pretokenize(text)) {
    auto it = cache.find(piece);
    if (it == cache.end()) it = cache.emplace(piece, encode_piece(std::string(piece))).first;
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

Tokenizer Tokenizer::from_tiktoken(const std::string& path) {
  std::ifstream in(path);
  MT_CHECK(in, "cannot open tiktoken file ", path);
  Tokenizer tok;
  tok.kind_ = Kind::kTiktoken;
  std::unordered_map<std::string, int32_t> ids;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string b64, extra;
    int64_t rank = -1;
    fields >> b64 >> rank;
    MT_CHECK(fields && !(fields >> extra), path, ":", line_no,
             ": expected \"base64(token bytes) rank\", got \"", line, "\"");
    auto bytes = detail::base64_decode(b64);
    MT_CHECK(bytes && !bytes->empty(), path, ":", line_no, ": bad base64 token \"", b64, "\"");
    MT_CHECK(rank >= 0 && rank < std::numeric_limits<int32_t>::max() - 1, path, ":", line_no,
             ": rank ", rank, " out of range");
    MT_CHECK(ids.emplace(*bytes, static_cast<int32_t>(rank)).second, path, ":", line_no,
             ": token \"", b64, "\" appears twice");
    if (static_cast<size_t>(rank) >= tok.tokens_.size()) tok.tokens_.resize(static_cast<size_t>(rank) + 1);
    MT_CHECK(tok.tokens_[static_cast<size_t>(rank)].empty(), path, ":", line_no, ": rank ", rank,
             " appears twice");
    tok.tokens_[static_cast<size_t>(rank)] = *bytes;
  }
  MT_CHECK(!ids.empty(), "tiktoken file ", path, " holds no tokens");
  tok.derive_rank_merges();
  tok.eot_ = static_cast<int32_t>(tok.tokens_.size());
  tok.tokens_.emplace_back(kEndOfText);
  tok.finish_byte_table(path);
  return tok;
}

void Tokenizer::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["eot"] = eot_;
  j["vocab_size"] = vocab_size();
  if (kind_ == Kind::kTrained) {
    j["kind"] = "bpe";
    // Bytes are ids 0..255 and merge i creates id 256 + i, so the merges are
    // the whole vocabulary.
    nlohmann::json merges = nlohmann::json::array();
    for (auto [l, r] : merge_list_) merges.push_back({l, r});
    j["merges"] = std::move(merges);
  } else {
    j["kind"] = "tiktoken";
    nlohmann::json tokens = nlohmann::json::array();
    for (int32_t id = 0; id < eot_; ++id) tokens.push_back(detail::base64_encode(tokens_[static_cast<size_t>(id)]));
    j["tokens"] = std::move(tokens);
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
  std::ifstream in(path);
  MT_CHECK(in, "cannot open tokenizer file ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL("tokenizer file ", path, " is not valid JSON: ", e.what());
  }
  MT_CHECK(j.is_object() && j.value("format", "") == kFormat, "tokenizer file ", path,
           " lacks \"format\": \"", kFormat, "\" (a tiktoken file loads with from_tiktoken / --tokenizer)");
  MT_CHECK(j.value("version", 0) == kVersion, "tokenizer file ", path, " has version ", j.value("version", 0),
           ", this build reads version ", kVersion);
  Tokenizer tok;
  try {
    std::string kind = j.at("kind").get<std::string>();
    if (kind == "bpe") {
      for (int b = 0; b < 256; ++b) tok.tokens_.emplace_back(1, static_cast<char>(b));
      for (const auto& m : j.at("merges")) {
        auto l = m.at(0).get<int32_t>(), r = m.at(1).get<int32_t>();
        auto next = static_cast<int32_t>(tok.tokens_.size());
        MT_CHECK(m.size() == 2 && l >= 0 && r >= 0 && l < next && r < next, "tokenizer file ", path,
                 ": merge ", m.dump(), " refers to ids not defined before id ", next);
        tok.merge_list_.emplace_back(l, r);
        tok.add_merge(l, r, next);
        tok.tokens_.push_back(tok.tokens_[static_cast<size_t>(l)] + tok.tokens_[static_cast<size_t>(r)]);
      }
    } else if (kind == "tiktoken") {
      tok.kind_ = Kind::kTiktoken;
      for (const auto& t : j.at("tokens")) {
        auto bytes = detail::base64_decode(t.get<std::string>());
        MT_CHECK(bytes, "tokenizer file ", path, ": bad base64 token ", t.dump());
        tok.tokens_.push_back(*bytes);
      }
      tok.derive_rank_merges();
    } else {
      MT_FAIL("tokenizer file ", path, ": unknown \"kind\": \"", kind, "\" (expected bpe or tiktoken)");
    }
    tok.eot_ = j.at("eot").get<int32_t>();
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL("tokenizer file ", path, " is malformed: ", e.what());
  }
  tok.tokens_.emplace_back(kEndOfText);
  tok.finish_byte_table(path);
  return tok;
}

}  // namespace meshtrain
