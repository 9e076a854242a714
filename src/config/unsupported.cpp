// Lets the trainer refuse, by key name, features that are configured but not
// built yet, instead of silently training something else.
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

std::vector<std::string> unsupported_features(const Config& c, const std::vector<std::string>& not_yet) {
  const nlohmann::json set = to_json(c);
  const nlohmann::json defaults = to_json(Config{});
  std::vector<std::string> messages;
  for (const auto& key : not_yet) {
    std::string pointer = "/" + key;
    for (auto& ch : pointer)
      if (ch == '.') ch = '/';
    const nlohmann::json::json_pointer at(pointer);
    MT_ASSERT(defaults.contains(at), "unsupported_features: '", key, "' is not a config key");
    if (set.at(at) != defaults.at(at)) messages.push_back("not supported yet: " + key + " = " + set.at(at).dump());
  }
  return messages;
}

}  // namespace meshtrain
