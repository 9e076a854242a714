#include "output_guard.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"

namespace fs = std::filesystem;

namespace meshtrain::detail {

namespace {

constexpr const char* kDataFormat = "meshtrain-data";

// The first entry of an earlier output that its manifest does not account
// for (a user's file put there later): replacing the folder would delete it.
std::string foreign_entry(const fs::path& out) {
  std::ifstream in(out / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, false);
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (!is_prepare_entry(name)) return e.path().string();
    if (name != "train" && name != "val") continue;
    if (!e.is_directory()) return e.path().string();
    std::set<std::string> listed;
    if (m.is_object() && m.contains(name) && m[name].is_object() && m[name].contains("shards") &&
        m[name]["shards"].is_array())
      for (const auto& s : m[name]["shards"])
        if (s.is_string()) listed.insert(s.get<std::string>());
    for (const auto& f : fs::directory_iterator(e.path()))
      if (!listed.count(f.path().filename().string())) return f.path().string();
  }
  return "";
}

}  // namespace

bool is_prepare_entry(const std::string& name) {
  return name == "train" || name == "val" || name == "tokenizer.json" || name == "manifest.json";
}

void check_prepare_output(const fs::path& out, const std::vector<std::string>& inputs) {
  const std::string o = out.string();
  for (const auto& input : inputs) {
    MT_CHECK(!is_same_or_inside(o, input), "prepare-data: --output ", o, " is ",
             is_same_or_inside(input, o) ? "the same as" : "inside", " the --input ", input,
             ": prepare-data never writes into its own inputs; choose an --output outside them");
    MT_CHECK(!is_same_or_inside(input, o), "prepare-data: --output ", o, " contains the --input ", input,
             ": replacing it would delete the input; choose an --output outside the inputs");
  }
  const std::string above = enclosing_meshtrain_folder(o, /*include_self=*/false);
  MT_CHECK(above.empty(), "prepare-data: --output ", o, " is inside ", above, ", which is ",
           meshtrain_format_name(manifest_format(above)), "; writing there would corrupt it. Choose another --output");
  std::error_code ec;
  if (!fs::exists(out, ec) && !fs::is_symlink(out, ec)) return;
  MT_CHECK(fs::is_directory(out, ec), "prepare-data: --output ", o, " exists and is not a folder; choose another --output");
  if (fs::is_empty(out, ec)) return;
  const std::string format = manifest_format(o);
  MT_CHECK(!format.empty(), "prepare-data: output folder ", o, " exists and is not an earlier prepare-data output "
           "(it has no manifest.json); choose another --output");
  MT_CHECK(format == kDataFormat, "prepare-data: output folder ", o, " holds a manifest.json that is not prepare-data's",
           meshtrain_format_name(format).empty() ? " (another tool's" : " (it is " + meshtrain_format_name(format),
           ", \"format\": ", format == "unmarked" ? std::string("none") : "\"" + format + "\"",
           "); it is never replaced. Choose another --output");
  const std::string extra = foreign_entry(out);
  MT_CHECK(extra.empty(), "prepare-data: output folder ", o, " is an earlier prepare-data output, but it also holds ",
           extra, ", which prepare-data did not write (replacing the folder would delete it); move it out or choose "
           "another --output");
}

std::vector<std::string> remove_prepare_leftovers(const fs::path& out) {
  return remove_dead_staging(out, [](const fs::path& p) {
    std::error_code ec;
    if (!fs::is_directory(p, ec) || fs::is_symlink(p, ec)) return false;
    for (const auto& e : fs::directory_iterator(p, ec))
      if (!is_prepare_entry(e.path().filename().string())) return false;
    return true;
  });
}

}  // namespace meshtrain::detail
