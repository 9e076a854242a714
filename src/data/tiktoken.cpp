// Tokenizer::from_tiktoken: the vocabulary files of OpenAI's tiktoken. The
// published ones are recognised by the sha256 tiktoken checks them against,
// and take their published pattern and special-token ids.
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "base64.h"
#include "bpe_tables.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"
#include "meshtrain/data/tokenizer.h"
#include "pretokenize.h"
#include "sha256.h"

namespace meshtrain {
namespace {

struct KnownVocabulary {
  const char* sha256;
  const char* name;
  const char* pattern;
  std::vector<std::pair<std::string, int32_t>> specials;
};

// tiktoken_ext/openai_public.py.
const std::vector<KnownVocabulary>& known_vocabularies() {
  static const std::vector<KnownVocabulary> known = {
      {"306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930", "r50k_base", "r50k",
       {{"<|endoftext|>", 50256}}},
      {"94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069", "p50k_base", "r50k",
       {{"<|endoftext|>", 50256}}},
      {"223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7", "cl100k_base", "cl100k",
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}}},
      {"446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d", "o200k_base", "o200k",
       {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
  };
  return known;
}

// A file that is not a tiktoken vocabulary at all (a binary, a text, a
// broken JSON file) is named as what it is not, with the accepted formats,
// before its sha256 or pattern is worth mentioning.
void check_looks_like_tiktoken(const std::string& path, const std::string& content) {
  std::istringstream lines(content);
  std::string line;
  while (std::getline(lines, line) && (line.empty() || line == "\r")) {
  }
  std::istringstream fields(line);
  std::string b64, extra;
  int64_t rank = -1;
  fields >> b64 >> rank;
  const bool ok = fields && !(fields >> extra) && rank >= 0 && detail::base64_decode(b64).has_value();
  MT_CHECK(ok, "tokenizer file ", path, " is not a tokenizer meshtrain reads: ",
           content.empty() ? std::string("it is empty") : "it is not a tiktoken vocabulary (its first line is not "
           "\"base64(token bytes) rank\") and not JSON", ". Accepted: a tiktoken file (*.tiktoken, e.g. "
           "cl100k_base.tiktoken), a Hugging Face byte-level BPE tokenizer.json, or meshtrain's own tokenizer.json");
}

}  // namespace

Tokenizer Tokenizer::from_tiktoken(const std::string& path, const std::string& pattern) {
  require_regular_file(path, "tiktoken file");
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot open tiktoken file ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string content = ss.str();
  check_looks_like_tiktoken(path, content);
  const std::string digest = detail::sha256_hex(content);
  const KnownVocabulary* known = nullptr;
  for (const auto& k : known_vocabularies()) {
    if (digest == k.sha256) known = &k;
  }
  MT_CHECK(known != nullptr || !pattern.empty(), "tiktoken file ", path, " (sha256 ", digest,
           ") is not one of the published r50k/p50k/cl100k/o200k files, so its pre-tokenizer pattern is unknown; "
           "pass --pattern gpt2|cl100k|o200k or a regex");

  Tokenizer tok;
  tok.kind_ = Kind::kTiktoken;
  tok.whole_piece_lookup_ = true;
  std::unordered_map<std::string, int32_t> ids;
  std::istringstream lines(content);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(lines, line)) {
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

  tok.merges_ = detail::merges_from_ranks(tok.tokens_);

  if (known != nullptr) {
    tok.specials_ = known->specials;
  } else {
    tok.specials_ = {{kEndOfText, static_cast<int32_t>(tok.tokens_.size())}};
  }
  for (const auto& [name, id] : tok.specials_) {
    if (static_cast<size_t>(id) >= tok.tokens_.size()) tok.tokens_.resize(static_cast<size_t>(id) + 1);
    MT_CHECK(tok.tokens_[static_cast<size_t>(id)].empty(), path, ": special token ", name, " id ", id,
             " is taken by an ordinary token");
    tok.tokens_[static_cast<size_t>(id)] = name;
    if (name == kEndOfText) tok.eot_ = id;
  }
  tok.pattern_ = pattern.empty() ? known->pattern : pattern;
  tok.finish(path);
  return tok;
}

}  // namespace meshtrain
