#pragma once
// Pre-tokenization: the text is cut into pieces by a regular expression
// (tiktoken's and GPT-2's published patterns, or any PCRE2 pattern), and BPE
// merges never cross a piece, so a word's tokens do not depend on its
// neighbours. PCRE2 runs in UTF mode with Unicode properties and JIT, with
// \s/\S rewritten to Unicode's White_Space (what the Rust regex engines of
// tiktoken and HF tokenizers mean by \s) and $ meaning end of text only.
// Bytes that are not valid UTF-8 never reach the regex: each becomes a piece
// of its own, so the pieces always concatenate back to the text.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::detail {

// The published patterns by name ("gpt2" = "r50k", "cl100k", "o200k"); any
// other string is taken as a pattern itself.
std::string resolve_pattern(const std::string& name_or_regex);
// The name of a published pattern, or "" for a custom one.
std::string pattern_name(const std::string& regex);

class Pretokenizer {
 public:
  Pretokenizer() = default;
  // Throws naming the pattern and the offset of a syntax error.
  explicit Pretokenizer(const std::string& regex);

  // Appends the pieces of text to out (views into text).
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  std::vector<std::string_view> split(std::string_view text) const {
    std::vector<std::string_view> out;
    split(text, out);
    return out;
  }
  const std::string& regex() const { return regex_; }

 private:
  void split_valid(std::string_view text, std::vector<std::string_view>& out) const;

  std::string regex_;
  std::shared_ptr<const void> code_;  // pcre2_code_8, immutable once compiled, shared by copies
};

// Length of the longest prefix of text that is valid UTF-8 (no overlongs,
// surrogates or code points above U+10FFFF).
size_t valid_utf8_prefix(std::string_view text);

}  // namespace meshtrain::detail
