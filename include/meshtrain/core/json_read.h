#pragma once
// Parsing the JSON files meshtrain reads (manifests, trainer states, flight
// records, Hugging Face configs, safetensors headers, tokenizer files) with
// a bound on nesting. nlohmann's parser is iterative, but copying, comparing
// or destroying a value recurses once per level: a file nested ~100,000 deep
// would crash the process at its first copy, with no message. The files
// meshtrain reads nest a handful of levels.
#include <nlohmann/json.hpp>
#include <string>

namespace meshtrain {

constexpr int kMaxJsonDepth = 64;

// `text` as JSON; throws naming `what` and `path`: not JSON (truncated,
// garbage), or nested deeper than kMaxJsonDepth.
nlohmann::json parse_json_text(const std::string& text, const std::string& what, const std::string& path);

// The same without throwing: a discarded value (is_discarded()), and *why
// says what is wrong ("" when the text is fine).
nlohmann::json try_parse_json_text(const std::string& text, std::string* why);

}  // namespace meshtrain
