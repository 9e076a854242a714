#include "meshtrain/core/log.h"

#include <algorithm>
#include <filesystem>

#include "meshtrain/ckpt/checkpoint.h"
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
