#pragma once
// UTF-8 repair for text shown to people: tokens may cut a character, and
// token ids decoded from a model's samples may form no character at all.
#include <string>
#include <string_view>

namespace meshtrain::detail {

// Every maximal invalid subsequence becomes U+FFFD (the W3C/WHATWG
// "substitution of maximal subparts" rule Python's errors="replace" uses).
std::string sanitize_utf8(std::string_view bytes);

}  // namespace meshtrain::detail
