#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/export_guard.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

void export_checkpoint(const std::string& ckpt_dir, const std::string& out_file, const std::string& prefix_filter) {
  check_export_output(ckpt_dir, out_file, /*dir_output=*/false);
  const CheckpointReader reader(ckpt_dir);
  reader.verify();  // an export is trusted downstream: never pass corrupt bytes on
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& name : reader.names())
    if (name.compare(0, prefix_filter.size(), prefix_filter) == 0) tensors.emplace_back(name, reader.read(name));
  MT_CHECK(!tensors.empty(), "checkpoint ", ckpt_dir, " has no tensor whose name starts with \"", prefix_filter, "\"");
  // "format": "pt" is what transformers' loaders look for in the metadata;
  // meshtrain_step marks the file as an export a later export may replace.
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"meshtrain_step", std::to_string(reader.step())}};
  // Written under a temporary name so a crash never leaves a plausible but
  // partial export; the pid lets the next export tell a dead run's leftover.
  const std::string tmp = out_file + ".tmp-" + std::to_string(::getpid());
  try {
    write_safetensors(tmp, tensors, metadata);
    std::error_code ec;
    std::filesystem::rename(tmp, out_file, ec);
    MT_CHECK(!ec, "cannot rename ", tmp, " to ", out_file, ": ", ec.message());
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

}  // namespace meshtrain
