// docs/config-reference.md from the code: the keys and their types from the
// schema, the defaults from a default-built Config, the allowed names from
// the choice tables, the resume rule from resume.cpp, the words from
// key_docs.cpp. Nothing in the file is typed by hand.
#include <sstream>

#include "json_value.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/reference.h"
#include "meshtrain/config/resume.h"
#include "schema.h"

namespace meshtrain {

namespace {

using nlohmann::json;

// The JSON type a key takes, as a user writes it.
template <class T>
const char* type_name(const T&) {
  if constexpr (is_choice_v<T>) return "string";
  else if constexpr (std::is_same_v<T, bool>) return "boolean";
  else if constexpr (std::is_same_v<T, int64_t>) return "integer";
  else if constexpr (std::is_same_v<T, uint64_t>) return "integer (unsigned)";
  else if constexpr (std::is_same_v<T, double>) return "number";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, std::array<int64_t, 3>>) return "[integer, integer, integer]";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "list of integers";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return "list of numbers";
  else if constexpr (std::is_same_v<T, std::vector<DatasetWeight>>) return "list of {\"path\": string, \"weight\": number}";
  else static_assert(sizeof(T) == 0, "a config member type without a name in the reference");
}

template <class T>
std::string allowed_values(const T&) {
  if constexpr (is_choice_v<T>) {
    std::string out;
    for (const auto& c : ChoiceTable<T>::entries) out += (out.empty() ? "`" : ", `") + std::string(c.name) + "`";
    return out;
  } else {
    return "";
  }
}

const char* resume_word(const std::string& path) {
  switch (resume_change(path)) {
    case ResumeChange::Free: return "free";
    case ResumeChange::Warned: return "warns";
    case ResumeChange::Refused: return "refused";
  }
  return "?";
}

// A table cell: one line, no column breaks.
std::string cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

struct Row {
  std::string key, type, value, allowed, resume, text;
};

// Rows of one section (kTop: the top-level keys), in the schema's order.
std::vector<Row> section_rows(const std::string& section) {
  const Config defaults;
  const json j = to_json(defaults);
  std::vector<Row> rows;
  schema::visit_fields(defaults, [&](const char* s, const char* key, const auto& member) {
    if (section != s) return;
    const std::string path = schema::key_path(s, key);
    const json& v = section.empty() ? j.at(key) : j.at(section).at(key);
    rows.push_back({key, type_name(member), "`" + v.dump() + "`", allowed_values(member), resume_word(path),
                    std::string(key_description(path))});
  });
  return rows;
}

void write_table(std::ostringstream& out, const std::vector<Row>& rows) {
  out << "| key | type | default | allowed values | on resume | what it does |\n";
  out << "|---|---|---|---|---|---|\n";
  for (const auto& r : rows)
    out << "| `" << r.key << "` | " << cell(r.type) << " | " << cell(r.value) << " | " << cell(r.allowed) << " | "
        << r.resume << " | " << cell(r.text) << " |\n";
}

const char* section_intro(const std::string& section) {
  if (section.empty()) return "The run: its folder, length, optimizer, parallelism strategy, saving and monitoring.";
  if (section == "model_config") return "The model. Every key here shapes the parameters unless said otherwise.";
  if (section == "data_config") return "Where the tokens come from and how they are batched.";
  if (section == "lr") return "AdamW and its learning-rate schedule (linear warmup, then cosine decay, as optax's "
                              "warmup_cosine_decay_schedule).";
  if (section == "device_config") return "The mesh and the devices.";
  if (section == "inference_config") return "Sampling: the end-of-run sample and `meshtrain generate`.";
  if (section == "seq_len_warmup") return "Sequence-length warmup (curriculum), off by default.";
  return "";
}

void write_header(std::ostringstream& out) {
  out << "# Configuration reference\n\n"
         "<!-- Generated: do not edit. scripts/dev/config-reference.sh writes this file from the code; "
         "ctest unit.config_reference fails when it differs. -->\n\n"
         "Every key meshtrain reads, generated from the code: the keys and their types from "
         "`src/config/schema.h`, the defaults from a default-built `Config` (`include/meshtrain/config/config.h`), "
         "the allowed values from `include/meshtrain/config/choices.h`, the resume rule from "
         "`src/config/resume.cpp` and the descriptions from `src/config/key_docs.cpp`.\n\n"
         "A config file is one JSON object in Jaxformer's layout: the sections below, and the top-level keys. A key "
         "left out keeps its default; `--set section.key=value` changes one on the command line (repeatable, "
         "applied in order after the file: `--set model_config.n_head=8`, `--set device_config.n_device_axis=[2,1,2]`). "
         "An unknown key (with a \"did you mean\"), a value of the wrong type, a key given twice in one object, a file "
         "nested deeper than 64 levels and an impossible combination are refused before any work, naming the key "
         "(`src/config/validate.cpp`).\n\n"
         "*On resume* says what `train` does when the newest checkpoint was saved with another value: `free` (it "
         "changes without a word), `warns` (the run resumes, naming the key) or `refused` (the run stops, naming the "
         "key and both values). Model keys are compared by what they mean: a 0 that stands for a derived value "
         "(`mlp_hidden` 0 = 4 x `model_dimension`) equals that value, and keys the model does not use are no "
         "change.\n\n";
}

void write_cloud_keys(std::ostringstream& out) {
  out << "## Jaxformer's cloud keys\n\n"
         "Accepted so that Jaxformer's files load unchanged, and ignored with a one-line warning naming what "
         "replaces them:\n\n"
         "| key | type | what replaces it |\n|---|---|---|\n";
  for (const auto& ck : schema::kCloudKeys)
    out << "| `" << schema::key_path(ck.section, ck.key) << "` | " << ck.type << " | " << cell(ck.replacement)
        << " |\n";
}

}  // namespace

std::string render_config_reference() {
  std::ostringstream out;
  write_header(out);
  std::vector<std::string> sections = {schema::kTop};
  sections.insert(sections.end(), schema::kSections.begin(), schema::kSections.end());
  out << "Sections:";
  for (const auto& s : sections) {
    const std::string title = s.empty() ? "Top-level keys" : s;
    const std::string anchor = s.empty() ? "top-level-keys" : s;
    out << (s.empty() ? " " : " · ") << "[" << title << "](#" << anchor << ")";
  }
  out << " · [Jaxformer's cloud keys](#jaxformers-cloud-keys)\n\n";
  for (const auto& s : sections) {
    out << "## " << (s.empty() ? "Top-level keys" : s) << "\n\n" << section_intro(s) << "\n\n";
    write_table(out, section_rows(s));
    out << "\n";
  }
  write_cloud_keys(out);
  return out.str();
}

}  // namespace meshtrain
