#include "pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "meshtrain/core/check.h"

namespace meshtrain::detail {
namespace {

// tiktoken_ext/openai_public.py, verbatim.
constexpr const char* kR50k =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
constexpr const char* kCl100k =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";
constexpr const char* kO200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Unicode White_Space, the meaning of \s in Rust's regex crates. PCRE2's own
// \s differs (it adds U+180E), so the patterns are rewritten to this class.
constexpr const char* kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string rewrite_whitespace(const std::string& regex) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < regex.size(); ++i) {
    char c = regex[i];
    if (c == '\\' && i + 1 < regex.size()) {
      char e = regex[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < regex.size() && regex[i + 1] == '^') out += regex[++i];
      if (i + 1 < regex.size() && regex[i + 1] == ']') out += regex[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct CodeDeleter {
  void operator()(const void* p) const { pcre2_code_free(static_cast<pcre2_code*>(const_cast<void*>(p))); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* p) const { pcre2_match_data_free(p); }
};

}  // namespace

std::string resolve_pattern(const std::string& name_or_regex) {
  if (name_or_regex == "gpt2" || name_or_regex == "r50k" || name_or_regex == "r50k_base" ||
      name_or_regex == "p50k" || name_or_regex == "p50k_base")
    return kR50k;
  if (name_or_regex == "cl100k" || name_or_regex == "cl100k_base") return kCl100k;
  if (name_or_regex == "o200k" || name_or_regex == "o200k_base") return kO200k;
  return name_or_regex;
}

std::string pattern_name(const std::string& regex) {
  if (regex == kR50k) return "gpt2";
  if (regex == kCl100k) return "cl100k";
  if (regex == kO200k) return "o200k";
  return "";
}

size_t valid_utf8_prefix(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;        // overlong
      else if (c == 0xED) hi = 0x9F;   // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;        // overlong
      else if (c == 0xF4) hi = 0x8F;   // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return n;
}

Pretokenizer::Pretokenizer(const std::string& regex) : regex_(regex) {
  MT_CHECK(!regex.empty(), "pre-tokenizer pattern is empty");
  const std::string rewritten = rewrite_whitespace(regex);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK, &error,
                                   &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof(msg));
    MT_FAIL("pre-tokenizer pattern \"", regex, "\" does not compile (PCRE2, at offset ", offset,
            " of the rewritten pattern): ", reinterpret_cast<const char*>(msg));
  }
  // JIT is several times faster; without it (unsupported CPU) the
  // interpreter gives the same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = std::shared_ptr<const void>(code, CodeDeleter());
}

void Pretokenizer::split_valid(std::string_view text, std::vector<std::string_view>& out) const {
  auto* code = static_cast<const pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code, nullptr));
  MT_CHECK(md != nullptr, "pre-tokenizer: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t gap = 0;  // start of text not covered by a match yet
  while (pos < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // A pathological piece (megabytes of whitespace) overflows the JIT
      // stack; the interpreter uses the heap instead.
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      MT_FAIL("pre-tokenizer pattern \"", regex_, "\" failed to match: ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t begin = ov[0], end = ov[1];
    if (end == begin) {
      // An empty match covers nothing: step one character so the loop ends.
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    // Text the pattern skipped stays a piece of its own (as in HF tokenizers'
    // Split with "Isolated"); tiktoken's patterns match every character.
    if (begin > gap) out.push_back(text.substr(gap, begin - gap));
    out.push_back(text.substr(begin, end - begin));
    pos = gap = end;
  }
  if (gap < text.size()) out.push_back(text.substr(gap));
}

void Pretokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  MT_CHECK(code_ != nullptr, "pre-tokenizer used before it was given a pattern");
  while (!text.empty()) {
    size_t valid = valid_utf8_prefix(text);
    if (valid > 0) split_valid(text.substr(0, valid), out);
    if (valid < text.size()) out.push_back(text.substr(valid, 1));
    text.remove_prefix(std::min(text.size(), valid + 1));
  }
}

}  // namespace meshtrain::detail
