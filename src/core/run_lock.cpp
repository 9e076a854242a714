#include "meshtrain/core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "meshtrain/core/check.h"
#include "meshtrain/core/host.h"
#include "meshtrain/core/log.h"

namespace meshtrain {

namespace {

std::string read_holder(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "an unknown process" : s;
}

}  // namespace

RunLock::RunLock(const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  MT_CHECK(!ec, "cannot create run directory '", run_dir, "': ", ec.message());
  const std::string path = (std::filesystem::path(run_dir) / "run.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  MT_CHECK(fd_ >= 0, "cannot open the run lock '", path, "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    MT_CHECK(err != EWOULDBLOCK, "run directory '", run_dir, "' is in use by another run (", holder,
             "); wait for it to finish, stop it, or choose another --name / --output_dir");
    MT_FAIL("cannot lock '", path, "': ", std::strerror(err));
  }
  const std::string me = "host " + hostname() + ", pid " + std::to_string(::getpid()) + "\n";
  // The lock itself is what excludes; the text only names the holder.
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    spdlog::warn("cannot write this run's name into {}: {}", path, std::strerror(errno));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace meshtrain
