#pragma once
// Durable file writing for checkpoints: a checkpoint counts as saved only when
// its bytes are on disk, so every file is fsync'ed, and so is the directory
// whose entries a rename changed.
#include <cstdint>
#include <string>

namespace meshtrain::ckpt_io {

struct Digest {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Writes sequentially, checksumming what it writes so nothing is read back.
class OutFile {
 public:
  explicit OutFile(const std::string& path);  // creates or truncates
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* data, size_t n);
  Digest finish();  // fsync + close; throws naming the file on failure

 private:
  std::string path_;
  int fd_ = -1;
  Digest digest_;
};

Digest write_file(const std::string& path, const std::string& content);  // durable, in place
void write_file_atomic(const std::string& path, const std::string& content);  // temp + rename
std::string read_file(const std::string& path);
void fsync_dir(const std::string& dir);

}  // namespace meshtrain::ckpt_io
