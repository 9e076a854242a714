#include "meshtrain/core/log.h"

#include <algorithm>
#include <filesystem>

#include "meshtrain/ckpt/checkpoint.h"
#include "manifest_format.h"
#include "meshtrain/ckpt/checkpoint_steps.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// Empty when the checkpoint is complete and intact, else why not.
std::string problem_with(const fs::path& dir) {
  try {
    CheckpointReader(dir.string()).verify();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  const fs::path root(checkpoints_root(run_dir));
  std::vector<std::pair<int64_t, std::string>> by_step;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& e : fs::directory_iterator(root)) {
    const auto step = parse_checkpoint_dir_name(e.path().filename().string());
    if (step && e.is_directory()) by_step.emplace_back(*step, e.path().string());
  }
  std::sort(by_step.rbegin(), by_step.rend());
  std::vector<std::string> out;
  for (auto& [step, dir] : by_step) out.push_back(dir);
  return out;
}

std::string set_aside_checkpoint(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "step_00000004/"
  const std::string name = p.filename().string();
  if (name.rfind("step_", 0) != 0) return "";
  // What set_aside() and the staging names in layout.cpp make: step_N<suffix>[.K].
  const auto marked = [&](const std::string& suffix) { return name.find(suffix) != std::string::npos; };
  if (marked(ckpt_format::kStagingMarker))
    return "it is a staging folder (a save in progress, or the leftover of one that was killed: the next save "
           "removes it), never a checkpoint to read";
  if (marked(".superseded"))
    return "it was set aside as superseded (a run resumed from further back went on without it), and a resume "
           "never reads it; to go on from it, rename it back to its step_XXXXXXXX name first (moving the newer "
           "checkpoints away)";
  if (marked(".unreadable"))
    return "it was set aside as unreadable (kept as evidence of a failed read), and a resume never reads it";
  return "";
}

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir) {
  // `latest` is written after the rename that completes a save, so a crash or
  // a full disk in between leaves it naming an older step: the steps decide.
  for (const auto& dir : list_checkpoints(run_dir)) {
    const std::string why = problem_with(dir);
    if (why.empty()) return dir;
    spdlog::warn("{}", "skipping checkpoint " + dir + ": " + why);
  }
  return std::nullopt;
}

}  // namespace meshtrain
