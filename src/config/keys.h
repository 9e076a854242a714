#pragma once
// Which dotted key paths exist, and what a user who wrote an unknown one meant.
#include <set>
#include <string>

namespace meshtrain::schema {

bool is_section(const std::string& name);

// "model_config.n_head", ..., top-level keys bare, cloud-only keys included.
std::set<std::string> known_paths();

// " (did you mean 'model_config.n_head'?)" or "" when nothing is close.
std::string suggestion(const std::string& section, const std::string& key, const std::set<std::string>& known);

}  // namespace meshtrain::schema
