#include "keys.h"

#include <algorithm>
#include <vector>

#include "json_value.h"
#include "schema.h"

namespace meshtrain::schema {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

bool is_section(const std::string& name) {
  return std::find(kSections.begin(), kSections.end(), name) != kSections.end();
}

std::set<std::string> known_paths() {
  std::set<std::string> paths;
  Config c;
  visit_fields(c, [&](const char* section, const char* key, auto&) {
    paths.insert(key_path(section, key));
  });
  for (const auto& ck : kCloudKeys) paths.insert(key_path(ck.section, ck.key));
  return paths;
}

// A typo (n_heads) or a key in the wrong section (top-level T): point at the
// key the user most likely meant.
std::string suggestion(const std::string& section, const std::string& key,
                       const std::set<std::string>& known) {
  for (const auto& p : known) {
    auto dot = p.find('.');
    std::string leaf = dot == std::string::npos ? p : p.substr(dot + 1);
    if (leaf == key) return " (did you mean '" + p + "'?)";
  }
  // A shortened name (dropout for dropout_rate) in the right section.
  for (const auto& p : known) {
    std::string prefix = section.empty() ? "" : section + ".";
    if (key.size() >= 4 && p.compare(0, prefix.size() + key.size(), prefix + key) == 0)
      return " (did you mean '" + p + "'?)";
  }
  std::string best;
  // Farther than 2 edits, or a third of the word, is a different word, not a typo.
  size_t best_d = std::min<size_t>(3, key.size() / 3 + 1);
  for (const auto& p : known) {
    std::string prefix = section.empty() ? "" : section + ".";
    if (p.compare(0, prefix.size(), prefix) != 0) continue;
    std::string leaf = p.substr(prefix.size());
    if (section.empty() && leaf.find('.') != std::string::npos) continue;
    size_t d = edit_distance(leaf, key);
    if (d < best_d) best_d = d, best = p;
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

}  // namespace meshtrain::schema
