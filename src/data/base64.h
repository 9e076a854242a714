#pragma once
// Standard base64 (RFC 4648, with padding): tiktoken files and tokenizer.json
// store token bytes this way because tokens are arbitrary bytes, not UTF-8.
#include <optional>
#include <string>

namespace meshtrain::detail {

std::string base64_encode(const std::string& bytes);
// nullopt on characters outside the alphabet or a bad length, so callers can
// name the file and line in their error.
std::optional<std::string> base64_decode(const std::string& text);

}  // namespace meshtrain::detail
