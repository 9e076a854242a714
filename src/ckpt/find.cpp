#include "meshtrain/core/log.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "file_io.h"
#include "manifest_format.h"
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

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

}  // namespace

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir) {
  const fs::path root(checkpoints_root(run_dir));
  if (!fs::is_directory(root)) return std::nullopt;

  std::vector<std::string> candidates;
  const fs::path latest = root / ckpt_format::kLatest;
  if (fs::exists(latest)) {
    std::string name;
    try {
      name = trimmed(ckpt_io::read_file(latest.string()));
    } catch (const std::exception& e) {
      spdlog::warn("{}", "ignoring " + latest.string() + ": " + e.what());
    }
    if (parse_checkpoint_dir_name(name))
      candidates.push_back(name);
    else if (!name.empty())
      spdlog::warn("{}", "ignoring " + latest.string() + ": \"" + name + "\" is not a checkpoint directory name");
  }
  std::vector<std::pair<int64_t, std::string>> by_step;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    const auto step = parse_checkpoint_dir_name(name);
    if (step && e.is_directory() && (candidates.empty() || name != candidates[0])) by_step.emplace_back(*step, name);
  }
  std::sort(by_step.rbegin(), by_step.rend());
  for (auto& [step, name] : by_step) candidates.push_back(name);

  for (const auto& name : candidates) {
    const std::string why = problem_with(root / name);
    if (why.empty()) return (root / name).string();
    spdlog::warn("{}", "skipping checkpoint " + (root / name).string() + ": " + why);
  }
  return std::nullopt;
}

}  // namespace meshtrain
