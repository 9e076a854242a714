// Hugging Face tokenizers' tokenizer.json for byte-level BPE (GPT-2,
// Llama-3, tiktoken conversions): Tokenizer::from_hf_json reads one,
// to_hf_tokenizer_json writes one. Token strings there are bytes mapped to
// printable characters by GPT-2's bytes_to_unicode table; HF's regexes are
// Oniguruma's, whose `$` means end of line and which has no possessive
// {n,m}+, so patterns are translated each way.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "json_file.h"
#include "meshtrain/core/check.h"
#include "hf_pattern.h"
#include "meshtrain/data/tokenizer.h"
#include "pretokenize.h"

namespace meshtrain {
namespace {

// HF's ByteLevel pre-tokenizer with use_regex: GPT-2's original pattern.
constexpr const char* kHfByteLevelRegex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
// the others for U+0100 onwards in byte order.
std::array<uint32_t, 256> byte_to_codepoint() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? b : next++;
  }
  return table;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string to_byte_level(const std::string& bytes, const std::array<uint32_t, 256>& table) {
  std::string out;
  for (char c : bytes) append_utf8(out, table[static_cast<unsigned char>(c)]);
  return out;
}

// The bytes a byte-level token string stands for; false when a character
// is outside the table (not a byte-level vocabulary).
bool from_byte_level(const std::string& s, const std::unordered_map<uint32_t, unsigned char>& inverse,
                     std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    size_t len;
    if (c < 0x80) { cp = c; len = 1; }
    else if ((c >> 5) == 0x6) { cp = c & 0x1F; len = 2; }
    else if ((c >> 4) == 0xE) { cp = c & 0x0F; len = 3; }
    else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    auto it = inverse.find(cp);
    if (it == inverse.end()) return false;
    out += static_cast<char>(it->second);
    i += len;
  }
  return true;
}

// Rewrites a regex between PCRE2/Rust and Oniguruma semantics, outside
// character classes: to_onig drops possessive markers (Oniguruma's Ruby
// syntax reads `{1,3}+` as "one or more of {1,3}"; in these patterns a
// possessive quantifier ends its alternative, so greedy matches the same)
// and turns `$` (end of text) into `\z`; from Oniguruma, `$` (end of line)
// becomes `(?=\n|\z)` and `{n,m}+` (repeated interval, not possessive) an
// open interval. So a tiktoken pattern converted by transformers, which
// HF runs with `\p{N}{1,3}+` meaning any run of digits, gives HF's ids here.
std::string translate_regex(const std::string& re, bool to_onig) {
  std::string out;
  bool last_quantifier = false;
  for (size_t i = 0; i < re.size(); ++i) {
    char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      out += c;
      out += re[++i];
      if ((re[i] == 'p' || re[i] == 'P') && i + 1 < re.size() && re[i + 1] == '{') {
        size_t close = re.find('}', i);
        if (close == std::string::npos) close = re.size() - 1;
        out.append(re, i + 1, close - i);
        i = close;
      }
      last_quantifier = false;
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < re.size() && re[j] == '^') ++j;
      if (j < re.size() && re[j] == ']') ++j;
      while (j < re.size() && re[j] != ']') j += re[j] == '\\' ? 2 : 1;
      out.append(re, i, std::min(j, re.size() - 1) - i + 1);
      i = j;
      last_quantifier = false;
    } else if (c == '{' && last_quantifier == false && !out.empty()) {
      size_t close = re.find('}', i);
      if (close == std::string::npos) {
        out += c;
        continue;
      }
      std::string interval = re.substr(i, close - i + 1);
      i = close;
      if (!to_onig && i + 1 < re.size() && re[i + 1] == '+') {
        // Oniguruma: "{n,m}+" repeats the interval; as one interval that is
        // "{n,}" when every count >= n is a sum of counts in [n, m].
        int n = 0, m = 0;
        MT_CHECK(std::sscanf(interval.c_str(), "{%d,%d}", &n, &m) == 2 && n >= 1 && m >= 2 * n - 1,
                 "regex \"", re, "\": Oniguruma's ", interval, "+ has no PCRE2 equivalent here");
        interval = "{" + std::to_string(n) + ",}";
        ++i;
      }
      out += interval;
      last_quantifier = true;
    } else if (c == '?' || c == '*' || c == '+') {
      if (last_quantifier) {
        // A second marker: '+' is possessive, '?' lazy.
        if (!(to_onig && c == '+')) out += c;
        last_quantifier = false;
      } else {
        out += c;
        last_quantifier = !(c == '?' && !out.empty() && out.size() >= 2 && out[out.size() - 2] == '(');
      }
    } else if (c == '$') {
      out += to_onig ? R"(\z)" : R"((?=\n|\z))";
      last_quantifier = false;
    } else {
      out += c;
      last_quantifier = false;
    }
  }
  return out;
}

const nlohmann::json* find_byte_level(const nlohmann::json& pre) {
  if (pre.is_object() && pre.value("type", "") == "ByteLevel") return &pre;
  return nullptr;
}

// The regex HF's pre-tokenizer applies, or an error naming what is unsupported.
std::string hf_pattern(const nlohmann::json& pre, const std::string& path) {
  MT_CHECK(pre.is_object(), path, ": \"pre_tokenizer\" is missing; only byte-level BPE tokenizers are supported");
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") {
    MT_CHECK(!pre.value("add_prefix_space", false), path,
             ": ByteLevel add_prefix_space=true is not supported (it prepends a space to every text)");
    MT_CHECK(pre.value("use_regex", true), path, ": ByteLevel without a regex is not supported");
    return kHfByteLevelRegex;
  }
  MT_CHECK(type == "Sequence" && pre.contains("pretokenizers"), path, ": pre_tokenizer type \"", type,
           "\" is not supported (expected ByteLevel, or Sequence of Split + ByteLevel)");
  const auto& list = pre.at("pretokenizers");
  MT_CHECK(list.size() == 2, path, ": a pre_tokenizer Sequence must be [Split, ByteLevel], got ", list.size(),
           " steps");
  const auto& split = list.at(0);
  const auto* bl = find_byte_level(list.at(1));
  MT_CHECK(split.value("type", "") == "Split" && bl != nullptr, path,
           ": a pre_tokenizer Sequence must be [Split, ByteLevel]");
  MT_CHECK(!bl->value("use_regex", true) && !bl->value("add_prefix_space", false), path,
           ": the ByteLevel after Split must have use_regex=false and add_prefix_space=false");
  MT_CHECK(split.value("behavior", "") == "Isolated" && !split.value("invert", false), path,
           ": only Split with behavior Isolated and invert=false is supported");
  MT_CHECK(split.contains("pattern") && split.at("pattern").contains("Regex"), path,
           ": Split needs a {\"Regex\": ...} pattern");
  return translate_regex(split.at("pattern").at("Regex").get<std::string>(), false);
}

}  // namespace

std::string detail::hf_canonical_pattern(const std::string& regex) {
  return translate_regex(translate_regex(regex, true), false);
}

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
  const nlohmann::json j = detail::read_json_file(path, "tokenizer file");
  Tokenizer tok;
  tok.kind_ = Kind::kHf;
  try {
    MT_CHECK(j.is_object() && j.contains("model"), path, " is not a Hugging Face tokenizer.json (no \"model\")");
    const auto& model = j.at("model");
    MT_CHECK(model.value("type", "BPE") == "BPE" && model.contains("vocab") && model.contains("merges"), path,
             ": model type \"", model.value("type", ""), "\" is not supported (only byte-level BPE)");
    MT_CHECK(j.value("normalizer", nlohmann::json()).is_null(), path,
             ": tokenizers with a normalizer are not supported (byte-level BPE has none)");
    MT_CHECK(!model.value("byte_fallback", false), path, ": byte_fallback BPE (SentencePiece style) is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const auto v = model.value(key, nlohmann::json());
      MT_CHECK(v.is_null() || v == "", path, ": model.", key, " is not supported");
    }
    tok.pattern_ = hf_pattern(j.value("pre_tokenizer", nlohmann::json()), path);
    tok.whole_piece_lookup_ = model.value("ignore_merges", false);

    const auto table = byte_to_codepoint();
    std::unordered_map<uint32_t, unsigned char> inverse;
    for (int b = 0; b < 256; ++b) inverse.emplace(table[b], static_cast<unsigned char>(b));
    std::unordered_map<std::string, int32_t> vocab;  // byte-level string -> id
    std::unordered_map<int32_t, std::string> added;
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      added.emplace(a.at("id").get<int32_t>(), a.at("content").get<std::string>());
    }
    std::string bytes;
    for (const auto& [key, value] : model.at("vocab").items()) {
      const auto id = value.get<int32_t>();
      MT_CHECK(id >= 0, path, ": vocab entry \"", key, "\" has a negative id");
      vocab.emplace(key, id);
      if (added.count(id)) continue;
      MT_CHECK(from_byte_level(key, inverse, bytes), path, ": vocab entry \"", key,
               "\" is not a byte-level token (is this a SentencePiece/WordPiece tokenizer?)");
      if (static_cast<size_t>(id) >= tok.tokens_.size()) tok.tokens_.resize(static_cast<size_t>(id) + 1);
      tok.tokens_[static_cast<size_t>(id)] = bytes;
    }
    for (const auto& m : model.at("merges")) {
      std::string left, right;
      if (m.is_string()) {
        const auto s = m.get<std::string>();
        const auto space = s.find(' ');
        MT_CHECK(space != std::string::npos, path, ": merge \"", s, "\" is not \"left right\"");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {
        left = m.at(0).get<std::string>();
        right = m.at(1).get<std::string>();
      }
      auto l = vocab.find(left), r = vocab.find(right), merged = vocab.find(left + right);
      MT_CHECK(l != vocab.end() && r != vocab.end() && merged != vocab.end(), path, ": merge ", m.dump(),
               " refers to tokens missing from the vocab");
      tok.merges_.push_back({l->second, r->second, merged->second});
    }
    for (const auto& [id, content] : added) {
      if (static_cast<size_t>(id) >= tok.tokens_.size()) tok.tokens_.resize(static_cast<size_t>(id) + 1);
      tok.tokens_[static_cast<size_t>(id)] = content;
      tok.specials_.emplace_back(content, id);
    }
    std::sort(tok.specials_.begin(), tok.specials_.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL("tokenizer file ", path, " is malformed: ", e.what());
  }
  // The document separator: GPT-2's name, Llama-3's, then common eos names.
  for (const char* name : {kEndOfText, "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"}) {
    for (const auto& [content, id] : tok.specials_) {
      if (tok.eot_ < 0 && content == name) tok.eot_ = id;
    }
  }
  MT_CHECK(tok.eot_ >= 0, path, ": no end-of-text special token among added_tokens (looked for ", kEndOfText,
           ", <|end_of_text|>, </s>, <eos>, <|im_end|>)");
  tok.finish(path);
  return tok;
}

std::string to_hf_tokenizer_json(const Tokenizer& tok) {
  const auto table = byte_to_codepoint();
  std::vector<bool> special(static_cast<size_t>(tok.vocab_size()), false);
  nlohmann::json added = nlohmann::json::array();
  for (const auto& [content, id] : tok.special_tokens()) {
    special[static_cast<size_t>(id)] = true;
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  nlohmann::json vocab = nlohmann::json::object();
  std::vector<std::string> names(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string& bytes = tok.token_bytes(id);
    if (special[static_cast<size_t>(id)] || bytes.empty()) continue;
    names[static_cast<size_t>(id)] = to_byte_level(bytes, table);
    vocab[names[static_cast<size_t>(id)]] = id;
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : tok.merges()) {
    merges.push_back(names[static_cast<size_t>(m[0])] + " " + names[static_cast<size_t>(m[1])]);
  }
  nlohmann::json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", translate_regex(tok.pattern(), true)}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", tok.whole_piece_lookup()},
        {"vocab", vocab},
        {"merges", merges}}},
  };
  return j.dump();
}

}  // namespace meshtrain
