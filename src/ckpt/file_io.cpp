#include "file_io.h"

#include <cstdint>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/fs.h"

namespace meshtrain::ckpt_io {

OutFile::OutFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MT_CHECK(fd_ >= 0, "cannot create ", path, ": ", std::strerror(errno));
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::write(const void* data, size_t n) {
  MT_ASSERT(fd_ >= 0, "write after finish on ", path_);
  digest_.crc32c = crc32c_update(digest_.crc32c, data, n);
  digest_.bytes += static_cast<int64_t>(n);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // write() may write less than asked (signals, >2 GiB on Linux); loop.
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    MT_CHECK(w > 0, "cannot write ", path_, ": ", write_failure(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

Digest OutFile::finish() {
  MT_ASSERT(fd_ >= 0, "finish twice on ", path_);
  const int fd = fd_;
  fd_ = -1;
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd) == 0;
  MT_CHECK(synced, "cannot fsync ", path_, ": ", std::strerror(sync_errno));
  MT_CHECK(closed, "cannot close ", path_, ": ", std::strerror(errno));
  return digest_;
}

Digest write_file(const std::string& path, const std::string& content) {
  OutFile f(path);
  f.write(content.data(), content.size());
  return f.finish();
}

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  write_file(tmp, content);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  MT_CHECK(!ec, "cannot rename ", tmp, " to ", path, ": ", ec.message());
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot open ", path);
  std::ostringstream os;
  os << in.rdbuf();
  MT_CHECK(!in.bad(), "read error in ", path);
  return os.str();
}

void fsync_dir(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MT_CHECK(fd >= 0, "cannot open directory ", d, " to fsync it: ", std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  MT_CHECK(ok, "cannot fsync directory ", d, ": ", std::strerror(err));
}

}  // namespace meshtrain::ckpt_io
