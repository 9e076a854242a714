#pragma once
// The pre-tokenizer regex in the form a Hugging Face tokenizer.json round trip
// gives (hf_tokenizer.cpp translates PCRE2 <-> Oniguruma: possessive markers
// dropped, `$` as `\z`), which meshtrain reads as the same pattern: so the
// tokenizer fingerprint does not change when a tokenizer is saved as HF JSON.
#include <string>

namespace meshtrain::detail {

std::string hf_canonical_pattern(const std::string& regex);

}  // namespace meshtrain::detail
