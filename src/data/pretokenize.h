#pragma once
// GPT-2 style pre-tokenization without a regex library: text is cut into
// contractions ('s 't 're 've 'm 'll 'd), runs of letters, digits or
// punctuation (each with an optional leading space), and runs of whitespace.
// BPE merges never cross these pieces, so a word's tokens do not depend on its
// neighbours. Every non-ASCII UTF-8 character counts as a letter and stays
// whole, which keeps accents and CJK inside words; malformed bytes still come
// out in some piece, so the pieces always concatenate back to the text.
#include <string_view>
#include <vector>

namespace meshtrain::detail {

std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace meshtrain::detail
