#include "meshtrain/core/json_read.h"

#include "meshtrain/core/check.h"

namespace meshtrain {

nlohmann::json try_parse_json_text(const std::string& text, std::string* why) {
  bool too_deep = false;
  // Returning false drops a value the parser is inside: nothing deeper than
  // the bound is ever built, however deep the text goes.
  const auto bound = [&too_deep](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    too_deep = too_deep || depth > kMaxJsonDepth;
    return !too_deep;
  };
  try {
    nlohmann::json j = nlohmann::json::parse(text, bound);
    if (too_deep) {
      *why = "it nests values more than " + std::to_string(kMaxJsonDepth) + " levels deep";
      return nlohmann::json(nlohmann::json::value_t::discarded);
    }
    why->clear();
    return j;
  } catch (const nlohmann::json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: ..." -> from "parse error" on.
    std::string what = e.what();
    if (const auto at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    *why = (too_deep ? "it nests values more than " + std::to_string(kMaxJsonDepth) + " levels deep; " : "") +
           "not valid JSON (truncated or damaged?): " + what;
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

nlohmann::json parse_json_text(const std::string& text, const std::string& what, const std::string& path) {
  std::string why;
  nlohmann::json j = try_parse_json_text(text, &why);
  MT_CHECK(why.empty(), what, " ", path, " cannot be read: ", why);
  return j;
}

}  // namespace meshtrain
