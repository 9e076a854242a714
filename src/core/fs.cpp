#include "meshtrain/core/fs.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <system_error>

namespace meshtrain {

void remove_quietly(const std::string& path, const std::string& why) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) spdlog::warn("{}", "could not remove " + path + " (" + why + "): " + ec.message());
}

std::string write_failure(int err) {
  std::string why = std::strerror(err);
  if (err == ENOSPC) return why + " (the disk is full)";
  if (err == EDQUOT) return why + " (the disk quota is used up)";
  if (err == EFBIG) {
    const int64_t limit = file_size_limit();
    return why + " (" +
           (limit > 0 ? "the file-size limit, ulimit -f, is " + std::to_string(limit) + " bytes"
                      : std::string("beyond the largest file this file system takes")) +
           ": raise it, or write less)";
  }
  return why;
}

int64_t file_size_limit() {
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<int64_t>(lim.rlim_cur);
}

}  // namespace meshtrain
