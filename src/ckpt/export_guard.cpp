#include "meshtrain/ckpt/export_guard.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"

namespace fs = std::filesystem;

namespace meshtrain {

namespace {

// The JSON header of a safetensors file (8-byte little-endian length, then
// the JSON); discarded when the file does not start like one.
nlohmann::json safetensors_header(const std::string& path, bool* empty_or_started = nullptr) {
  std::ifstream in(path, std::ios::binary);
  unsigned char len_bytes[8] = {};
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  if (empty_or_started) *empty_or_started = in.gcount() == 0;
  if (in.gcount() != 8) return nlohmann::json::value_t::discarded;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n < 2 || n > (uint64_t{100} << 20)) return nlohmann::json::value_t::discarded;
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (empty_or_started) *empty_or_started = !text.empty() && text[0] == '{';
  if (static_cast<uint64_t>(in.gcount()) != n) return nlohmann::json::value_t::discarded;
  return nlohmann::json::parse(text, nullptr, false);
}

// What --format hf writes into its folder.
bool is_hf_export_entry(const std::string& name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json" || name == "config.json" ||
      name == "generation_config.json" || name == "tokenizer.json")
    return true;
  return name.rfind("model-", 0) == 0 && name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
}

}  // namespace

bool is_meshtrain_export(const std::string& path) {
  const nlohmann::json h = safetensors_header(path);
  return h.is_object() && h.contains("__metadata__") && h["__metadata__"].is_object() &&
         h["__metadata__"].contains("meshtrain_step");
}

void check_export_output(const std::string& ckpt_dir, const std::string& out, bool dir_output,
                         const std::vector<std::string>& reads) {
  MT_CHECK(!is_same_or_inside(out, ckpt_dir), "checkpoint export: --output ", out,
           is_same_or_inside(ckpt_dir, out) ? " is the checkpoint folder " : " is inside the checkpoint ", ckpt_dir,
           " that it reads; writing there would destroy the checkpoint. Choose an --output outside it");
  MT_CHECK(!is_same_or_inside(ckpt_dir, out), "checkpoint export: --output ", out, " contains the checkpoint ",
           ckpt_dir, " that it reads; choose an --output outside it");
  for (const auto& r : reads)
    MT_CHECK(!is_same_or_inside(out, r) && !is_same_or_inside(r, out), "checkpoint export: --output ", out,
             " would overwrite ", r, ", which the export reads; choose another --output");
  const std::string above = enclosing_meshtrain_folder(out, /*include_self=*/false);
  MT_CHECK(above.empty(), "checkpoint export: --output ", out, " is inside ", above, ", which is ",
           meshtrain_format_name(manifest_format(above)), "; writing there would corrupt it. Choose another --output");
  const fs::path parent = fs::absolute(out).parent_path();
  std::error_code ec;
  MT_CHECK(fs::is_directory(parent, ec), "checkpoint export: --output ", out, ": folder ", parent.string(),
           " does not exist");
  if (!fs::exists(out, ec)) return;
  if (dir_output) {
    MT_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), "checkpoint export: --output ", out,
             " exists and is not an empty directory (--format hf writes a new folder; choose a new one)");
    return;
  }
  MT_CHECK(!fs::is_directory(out, ec), "checkpoint export: --output ", out,
           " is a folder; give the file to write, e.g. ", (fs::path(out) / "model.safetensors").string());
  MT_CHECK(is_meshtrain_export(out), "checkpoint export: --output ", out, " exists and is not an earlier meshtrain ",
           "export (", non_regular_kind(out).empty() ? "a file meshtrain did not write" : non_regular_kind(out),
           "); it is never overwritten. Choose another --output or remove it yourself");
}

std::vector<std::string> remove_export_leftovers(const std::string& out, bool dir_output) {
  std::vector<std::string> removed = remove_dead_staging(out, [dir_output](const fs::path& p) {
    std::error_code ec;
    if (fs::is_symlink(p, ec)) return false;
    if (dir_output) {
      if (!fs::is_directory(p, ec)) return false;
      for (const auto& e : fs::directory_iterator(p, ec))
        if (!is_hf_export_entry(e.path().filename().string())) return false;
      return true;
    }
    bool started = false;
    safetensors_header(p.string(), &started);
    return fs::is_regular_file(p, ec) && started;
  });
  // Builds before this one staged a file export as OUT.tmp, without a pid.
  const std::string legacy = out + ".tmp";
  std::error_code ec;
  if (!dir_output && fs::is_regular_file(legacy, ec) && !fs::is_symlink(legacy, ec) && is_meshtrain_export(legacy) &&
      fs::remove(legacy, ec))
    removed.push_back(legacy);
  return removed;
}

}  // namespace meshtrain
