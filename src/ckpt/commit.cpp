#include "meshtrain/core/log.h"

#include <algorithm>
#include <filesystem>

#include "file_io.h"
#include "manifest_format.h"
#include "meshtrain/core/fs.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  MT_CHECK(!ec, "cannot rename ", from.string(), " to ", to.string(), ": ", ec.message());
}

// Keeps the checkpoint just saved and the newest max_to_keep-1 older ones.
// Checkpoints newer than the one just saved belong to a run that was resumed
// from further back; they are left alone rather than silently destroyed.
void prune(const fs::path& root, int64_t saved_step, int64_t max_to_keep) {
  std::vector<std::pair<int64_t, fs::path>> older;
  std::vector<fs::path> stale;
  // Collect first: removing entries while iterating a directory is unspecified.
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory()) continue;
    if (name.rfind("step_", 0) == 0 && name.find(ckpt_format::kStagingMarker) != std::string::npos) {
      stale.push_back(e.path());
      continue;
    }
    const auto step = parse_checkpoint_dir_name(name);
    if (step && *step < saved_step) older.emplace_back(*step, e.path());
  }
  for (const auto& p : stale) remove_quietly(p.string(), "stale staging dir");
  if (max_to_keep <= 0) return;
  std::sort(older.rbegin(), older.rend());
  for (size_t i = static_cast<size_t>(max_to_keep - 1); i < older.size(); ++i)
    remove_quietly(older[i].second.string(), "beyond max_to_keep");
}

}  // namespace

std::string commit_checkpoint(const std::string& run_dir, const std::string& staging_dir, int64_t step,
                              nlohmann::json manifest, const nlohmann::json& trainer_state, int64_t max_to_keep) {
  const fs::path staging(staging_dir);
  const auto state = ckpt_io::write_file((staging / ckpt_format::kTrainerState).string(), trainer_state.dump(2));
  manifest["files"][ckpt_format::kTrainerState] = {{"bytes", state.bytes}, {"checksum", crc32c_string(state.crc32c)}};
  ckpt_io::write_file((staging / ckpt_format::kManifest).string(), manifest.dump(2));
  ckpt_io::fsync_dir(staging.string());

  const fs::path root(checkpoints_root(run_dir));
  const std::string name = checkpoint_dir_name(step);
  const fs::path final_dir = root / name;
  // A re-save of the same step: move the old one aside first, so at every
  // moment either the old or the new checkpoint sits under the final name or
  // (after a crash between the two renames) a staging name that is ignored.
  const fs::path replaced = root / (name + ckpt_format::kStagingMarker + "-replaced");
  const bool had_old = fs::exists(final_dir);
  if (had_old) {
    remove_quietly(replaced.string(), "leftover of an earlier re-save");
    rename_or_throw(final_dir, replaced);
  }
  rename_or_throw(staging, final_dir);
  ckpt_io::fsync_dir(root.string());
  ckpt_io::write_file_atomic((root / ckpt_format::kLatest).string(), name + "\n");
  if (had_old) remove_quietly(replaced.string(), "replaced by a re-save");
  prune(root, step, max_to_keep);
  return final_dir.string();
}

}  // namespace meshtrain
