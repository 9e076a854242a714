// The config file and its `--set` overrides -> a validated Config.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "architecture.h"
#include "keys.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"
#include "schema.h"

namespace meshtrain {

using nlohmann::json;

namespace {

// Sections and keys nest 3 deep; 64 leaves room for any hand-written value.
constexpr int kMaxConfigDepth = 64;

// Default values of every key, cloud-only ones included: tells apply_override
// which keys exist and which take strings.
json schema_defaults() {
  json j = to_json(Config{});
  j["data_config"]["bucket_name"] = "";
  j["data_config"]["process_path"] = "";
  j["wandb"] = false;
  return j;
}

std::string read_file(const std::string& path) {
  MT_CHECK(std::filesystem::exists(path), "config file '", path, "' does not exist");
  require_regular_file(path, "config file");
  std::ifstream in(path);
  MT_CHECK(in.good(), "config file '", path, "' cannot be opened for reading");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The dotted key the parser is inside ("model_config.n_head", "rampup_batch_size[1]"),
// kept up to date by the parser callback so an error can name where it happened.
class KeyTracker {
 public:
  bool on_event(int depth, json::parse_event_t event, json& parsed) {
    // Copying a JSON value recurses once per level: a file nested ~100,000
    // deep overflows the stack as the config is copied. Configs are 3 deep.
    if (depth > kMaxConfigDepth) too_deep_ = true;
    if (too_deep_) return false;  // the parser drops the rest of the value
    switch (event) {
      case json::parse_event_t::object_start: frames_.push_back({"", -1}); break;
      case json::parse_event_t::array_start: frames_.push_back({"", 0}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        advance();
        break;
      case json::parse_event_t::key:
        if (!frames_.empty()) {
          frames_.back().key = parsed.get<std::string>();
          // JSON parsers keep the last of two equal keys: the first would be dropped unseen.
          if (!frames_.back().seen.insert(frames_.back().key).second) duplicate_ = path();
        }
        break;
      case json::parse_event_t::value: advance(); break;
    }
    return true;
  }
  // The first key given twice in one object ("" none).
  const std::string& duplicate() const { return duplicate_; }
  // Whether the file nests deeper than kMaxConfigDepth (the path says where).
  bool too_deep() const { return too_deep_; }
  std::string path() const {
    std::string out;
    for (const auto& f : frames_) {
      if (f.index >= 0) out += "[" + std::to_string(f.index) + "]";
      else if (!f.key.empty()) out += (out.empty() ? "" : ".") + f.key;
    }
    return out;
  }

 private:
  struct Frame {
    std::string key;
    int64_t index;  // -1: an object
    std::set<std::string> seen = {};  // an object's keys so far
  };
  void advance() {
    if (!frames_.empty() && frames_.back().index >= 0) ++frames_.back().index;
  }
  std::vector<Frame> frames_;
  std::string duplicate_;
  bool too_deep_ = false;
};

json parse_file(const std::string& path, const std::string& text) {
  KeyTracker keys;
  try {
    // Comments are allowed: configs are hand-edited and benefit from a note.
    json j = json::parse(
        text, [&keys](int depth, json::parse_event_t event, json& parsed) { return keys.on_event(depth, event, parsed); },
        true, /*ignore_comments=*/true);
    MT_CHECK(!keys.too_deep(), "config file '", path, "' nests values more than ", kMaxConfigDepth, " levels deep",
             keys.path().empty() ? std::string() : " (under '" + keys.path().substr(0, 40) + "...')",
             "; a config is sections of keys (e.g. model_config.n_head), 3 levels");
    MT_CHECK(j.is_object(), "config file '", path, "' holds a JSON ", j.type_name(), ", not an object: a config is one ",
             "{...} of sections and keys, e.g. {\"model_config\": {\"n_head\": 4}} (configs/tiny.json)");
    MT_CHECK(keys.duplicate().empty(), "config file '", path, "': key '", keys.duplicate(),
             "' is given twice in the same object; only the last would count. Keep one of them");
    return j;
  } catch (const json::parse_error& e) {
    // e.byte counts from 1 and points at the character that broke the parse.
    size_t end = std::min(e.byte == 0 ? 0 : e.byte - 1, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < end; ++i) {
      if (text[i] == '\n') ++line, column = 1;
      else ++column;
    }
    std::string reason = e.what();
    auto colon = reason.find(": ");
    if (colon != std::string::npos) reason = reason.substr(colon + 2);
    const std::string key = keys.path();
    MT_FAIL("config file '", path, "' is not valid JSON: line ", line, ", column ", column,
            key.empty() ? std::string() : " (in key '" + key + "')", ": ", reason);
  } catch (const json::exception& e) {
    // E.g. 1e400: valid JSON syntax, but no double holds it.
    std::string reason = e.what();
    auto bracket = reason.find("] ");
    if (bracket != std::string::npos) reason = reason.substr(bracket + 2);
    const std::string key = keys.path();
    MT_FAIL("config file '", path, "': ", key.empty() ? std::string("a value") : "config key '" + key + "'",
            " cannot be read: ", reason);
  }
}

}  // namespace

void apply_override(json& j, const std::string& assignment) {
  auto eq = assignment.find('=');
  MT_CHECK(eq != std::string::npos && eq > 0, "--set '", assignment,
           "': expected key=value, e.g. --set model_config.n_head=4");
  std::string path = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);

  auto dot = path.find('.');
  std::string section = dot == std::string::npos ? "" : path.substr(0, dot);
  std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
  MT_CHECK(!schema::is_section(path), "--set '", assignment, "': '", path,
           "' is a section; set one of its keys, e.g. --set ", path, ".<key>=value");
  const auto known = schema::known_paths();
  MT_CHECK(known.count(path), "--set '", assignment, "': unknown config key '", path, "'",
           schema::suggestion(section, key, known));

  bool too_deep = false;
  json value = json::parse(
      text,
      [&too_deep](int depth, json::parse_event_t, json&) {
        too_deep = too_deep || depth > kMaxConfigDepth;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  MT_CHECK(!too_deep, "--set '", assignment.substr(0, 200), assignment.size() > 200 ? "...'" : "'",
           ": the value nests more than ", kMaxConfigDepth, " levels deep");
  const json defaults = schema_defaults();
  const json& expected = section.empty() ? defaults.at(key) : defaults.at(section).at(key);
  // `--set name=123` means the name "123", and `--set prompt=` the empty prompt.
  if (value.is_discarded() || (expected.is_string() && !value.is_string())) value = text;

  MT_CHECK(j.is_object(), "--set '", assignment, "': the config is not a JSON object");
  json* scope = &j;
  if (!section.empty()) {
    scope = &j[section];  // creates the section when the file has none
    if (scope->is_null()) *scope = json::object();
    MT_CHECK(scope->is_object(), "--set '", assignment, "': config section '", section,
             "' is not an object");
  }
  (*scope)[key] = value;
}

LoadedConfig load_config(const std::string& path, const std::vector<std::string>& sets) {
  LoadedConfig loaded;
  loaded.json = parse_file(path, read_file(path));
  // The file as written decides its architecture, so `--set model_config.attention=mha`
  // on a Jaxformer file changes that key only, not every Jaxformer default.
  const Architecture arch = schema::resolve_architecture(loaded.json);
  for (const auto& s : sets) apply_override(loaded.json, s);
  nlohmann::json as_read = loaded.json;
  if (as_read.contains("model_config") && as_read["model_config"].is_object()) {
    auto& m = as_read["model_config"];
    const bool undecided = !m.contains("architecture") || m["architecture"] == "auto";
    if (undecided && schema::resolve_architecture(as_read) != arch) m["architecture"] = arch;
  }
  try {
    loaded.config = config_from_json(as_read, &loaded.warnings);
    validate(loaded.config);
  } catch (const Error& e) {
    // Name the file: with several configs around, the key alone is ambiguous.
    throw Error("config file '" + path + "': " + e.what());
  }
  return loaded;
}

}  // namespace meshtrain
