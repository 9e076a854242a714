// JSON <-> Config through the one key list in schema.h.
#include "architecture.h"
#include "json_value.h"
#include "keys.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "schema.h"

namespace meshtrain {

using nlohmann::json;
using schema::key_path;

namespace {

void check_keys(const json& j) {
  MT_CHECK(j.is_object(), "config: expected a JSON object at the top level, found ", schema::describe(j));
  const auto known = schema::known_paths();
  std::string unknown;
  auto note = [&](const std::string& section, const std::string& key) {
    if (known.count(key_path(section, key))) return;
    if (!unknown.empty()) unknown += "; ";
    unknown += "unknown config key '" + key_path(section, key) + "'" + schema::suggestion(section, key, known);
  };
  for (const auto& [name, value] : j.items()) {
    if (!schema::is_section(name)) {
      note(schema::kTop, name);
      continue;
    }
    MT_CHECK(value.is_object(), "config section '", name, "': expected an object, found ",
             schema::describe(value));
    for (const auto& item : value.items()) note(name, item.key());
  }
  MT_CHECK(unknown.empty(), unknown);
}

const json* find(const json& j, const std::string& section, const std::string& key) {
  const json* scope = &j;
  if (!section.empty()) {
    auto s = j.find(section);
    if (s == j.end()) return nullptr;
    scope = &*s;
  }
  auto v = scope->find(key);
  return v == scope->end() ? nullptr : &*v;
}

void check_cloud_keys(const json& j, std::vector<std::string>* warnings) {
  for (const auto& ck : schema::kCloudKeys) {
    const json* v = find(j, ck.section, ck.key);
    if (!v) continue;
    std::string path = key_path(ck.section, ck.key);
    std::string type = ck.type;
    bool ok = type == "string" ? v->is_string() : type == "boolean" ? v->is_boolean() : v->is_number_integer();
    MT_CHECK(ok, "config key '", path, "': expected a ", type, ", found ", schema::describe(*v));
    if (warnings) warnings->push_back(path + " is a Jaxformer cloud key, ignored: " + ck.replacement);
  }
}

}  // namespace

Config config_from_json(const json& j, std::vector<std::string>* warnings) {
  check_keys(j);
  Config c;
  schema::visit_fields(c, [&](const char* section, const char* key, auto& member) {
    if (const json* v = find(j, section, key)) schema::read_value(*v, key_path(section, key), member);
  });
  // After the values are read: the preset's ffn depends on n_experts.
  schema::apply_architecture(j, schema::resolve_architecture(j), c.model);
  check_cloud_keys(j, warnings);
  // Jaxformer writes to a bucket (gs://...); here runs live on the local disk.
  if (c.output_dir.find("://") != std::string::npos) {
    if (warnings)
      warnings->push_back("output_dir '" + c.output_dir +
                          "' is a cloud path: runs are written to the local folder 'runs/' instead");
    c.output_dir = "runs/";
  }
  return c;
}

json to_json(const Config& c) {
  json j = json::object();
  for (const char* s : schema::kSections) j[s] = json::object();
  schema::visit_fields(c, [&](const char* section, const char* key, const auto& member) {
    if (*section)
      j[section][key] = member;
    else
      j[key] = member;
  });
  return j;
}

}  // namespace meshtrain
