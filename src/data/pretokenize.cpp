#include "pretokenize.h"

namespace meshtrain::detail {
namespace {

enum class CharClass { kLetter, kDigit, kSpace, kPunct };

// Length of the UTF-8 character starting at text[i], clipped to the text so a
// truncated sequence at the end never reads past it.
size_t char_len(std::string_view text, size_t i) {
  unsigned char c = static_cast<unsigned char>(text[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  size_t k = 1;
  while (k < n && i + k < text.size() && (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80) ++k;
  return k;
}

CharClass classify(char ch) {
  unsigned char c = static_cast<unsigned char>(ch);
  if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
  if (c >= '0' && c <= '9') return CharClass::kDigit;
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return CharClass::kSpace;
  return CharClass::kPunct;
}

size_t contraction_len(std::string_view text, size_t i) {
  if (text[i] != '\'') return 0;
  for (std::string_view s : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"}) {
    if (text.substr(i, s.size()) == s) return s.size();
  }
  return 0;
}

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (size_t c = contraction_len(text, i)) {
      pieces.push_back(text.substr(i, c));
      i += c;
      continue;
    }
    size_t j = i;
    // A single leading space joins the word that follows it (" the").
    if (text[j] == ' ' && j + 1 < n && classify(text[j + 1]) != CharClass::kSpace) ++j;
    CharClass cls = classify(text[j]);
    if (cls == CharClass::kSpace) {
      size_t end = j;
      while (end < n && classify(text[end]) == CharClass::kSpace) ++end;
      // Like GPT-2's \s+(?!\S): leave the last whitespace character to the
      // next word so " word" keeps its space.
      if (end < n && end - j > 1) --end;
      pieces.push_back(text.substr(i, end - i));
      i = end;
      continue;
    }
    size_t end = j;
    while (end < n && classify(text[end]) == cls) end += char_len(text, end);
    pieces.push_back(text.substr(i, end - i));
    i = end;
  }
  return pieces;
}

}  // namespace meshtrain::detail
