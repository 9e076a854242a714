#pragma once
// Strict JSON -> C++ value conversion for config keys: the error names the key,
// the type it needs and what the file holds. No silent coercion: 1.5 is not an
// integer, "true" is not a boolean.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/config/config.h"

namespace meshtrain {
// Written back as {"path": ..., "weight": ...} (found by argument lookup).
inline void to_json(nlohmann::json& j, const DatasetWeight& d) { j = {{"path", d.path}, {"weight", d.weight}}; }
}  // namespace meshtrain

namespace meshtrain::schema {

// "number (1.5)", "string (\"4\")", "boolean (true)": what a user wrote.
std::string describe(const nlohmann::json& v);

void read_value(const nlohmann::json& v, const std::string& path, int64_t& out);
void read_value(const nlohmann::json& v, const std::string& path, uint64_t& out);
void read_value(const nlohmann::json& v, const std::string& path, double& out);
void read_value(const nlohmann::json& v, const std::string& path, bool& out);
void read_value(const nlohmann::json& v, const std::string& path, std::string& out);
void read_value(const nlohmann::json& v, const std::string& path, std::array<int64_t, 3>& out);
void read_value(const nlohmann::json& v, const std::string& path, std::vector<int64_t>& out);
void read_value(const nlohmann::json& v, const std::string& path, std::vector<double>& out);
void read_value(const nlohmann::json& v, const std::string& path, std::vector<DatasetWeight>& out);

// A choice key (choices.h): a string naming one of its values; anything else
// fails naming the key and the allowed values.
[[noreturn]] void not_a_choice(const std::string& path, const std::string& allowed, const std::string& got);
template <class E, std::enable_if_t<is_choice_v<E>, int> = 0>
void read_value(const nlohmann::json& v, const std::string& path, E& out) {
  std::string name;
  read_value(v, path, name);
  const std::optional<E> parsed = parse_choice<E>(name);
  if (!parsed) not_a_choice(path, choice_list<E>(), name);
  out = *parsed;
}

// "section.key", or "key" at the top level.
inline std::string key_path(const std::string& section, const std::string& key) {
  return section.empty() ? key : section + "." + key;
}

}  // namespace meshtrain::schema
