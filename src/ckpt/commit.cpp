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

// Moves p to p + suffix (or suffix.1, .2 ... when taken): kept, but no longer a checkpoint name.
void set_aside(const fs::path& p, const std::string& suffix) {
  fs::path to = p.string() + suffix;
  for (int i = 1; fs::exists(to); ++i) to = p.string() + suffix + "." + std::to_string(i);
  rename_or_throw(p, to);
  spdlog::warn("{}", "kept " + p.string() + " as " + to.string());
}

// Keeps the checkpoint just saved and the newest max_to_keep-1 older ones.
// Checkpoints newer than the one just saved belong to a run that was resumed
// from further back; they are set aside (renamed) so that a later resume,
// which takes the newest step, continues this history, not the abandoned one.
// Checkpoints in `keep` are never removed.
void prune(const fs::path& root, int64_t saved_step, int64_t max_to_keep, const std::vector<std::string>& keep) {
  std::vector<std::pair<int64_t, fs::path>> older;
  std::vector<fs::path> stale, newer;
  const auto kept = [&](const std::string& name) { return std::find(keep.begin(), keep.end(), name) != keep.end(); };
  // Collect first: removing entries while iterating a directory is unspecified.
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory()) continue;
    if (name.rfind("step_", 0) == 0 && name.find(ckpt_format::kStagingMarker) != std::string::npos) {
      stale.push_back(e.path());
      continue;
    }
    const auto step = parse_checkpoint_dir_name(name);
    if (!step || kept(name)) continue;
    if (*step < saved_step) older.emplace_back(*step, e.path());
    if (*step > saved_step) newer.push_back(e.path());
  }
  for (const auto& p : stale) remove_quietly(p.string(), "stale staging dir");
  for (const auto& p : newer) {
    try {
      set_aside(p, ".superseded");
    } catch (const std::exception& e) {  // the save itself is complete; say so and go on
      spdlog::warn("{}", e.what());
    }
  }
  if (max_to_keep <= 0) return;
  std::sort(older.rbegin(), older.rend());
  for (size_t i = static_cast<size_t>(max_to_keep - 1); i < older.size(); ++i)
    remove_quietly(older[i].second.string(), "beyond max_to_keep");
}

}  // namespace

std::string commit_checkpoint(const std::string& run_dir, const std::string& staging_dir, int64_t step,
                              nlohmann::json manifest, const nlohmann::json& trainer_state, int64_t max_to_keep,
                              const std::vector<std::string>& keep) {
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
  // A checkpoint the run could not read is evidence, never overwritten.
  if (fs::exists(final_dir) && std::find(keep.begin(), keep.end(), name) != keep.end())
    set_aside(final_dir, ".unreadable");
  const bool had_old = fs::exists(final_dir);
  if (had_old) {
    remove_quietly(replaced.string(), "leftover of an earlier re-save");
    rename_or_throw(final_dir, replaced);
  }
  rename_or_throw(staging, final_dir);
  ckpt_io::fsync_dir(root.string());
  // `latest` is a hint for people and tools (a resume finds the newest step
  // itself): the checkpoint is complete whether or not it can be rewritten.
  try {
    ckpt_io::write_file_atomic((root / ckpt_format::kLatest).string(), name + "\n");
  } catch (const std::exception& e) {
    spdlog::warn("checkpoint {} is complete, but {} could not be updated to name it ({}); a resume finds the newest "
                 "checkpoint by itself", final_dir.string(), (root / ckpt_format::kLatest).string(), e.what());
  }
  if (had_old) remove_quietly(replaced.string(), "replaced by a re-save");
  prune(root, step, max_to_keep, keep);
  return final_dir.string();
}

}  // namespace meshtrain
