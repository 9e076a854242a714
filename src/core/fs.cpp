#include "meshtrain/core/fs.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <system_error>

namespace meshtrain {

void remove_quietly(const std::string& path, const std::string& why) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) spdlog::warn("{}", "could not remove " + path + " (" + why + "): " + ec.message());
}

}  // namespace meshtrain
