#pragma once
// Input files as byte streams, decompressed on the fly: gzip (zlib, any
// number of concatenated members) and zstd are recognised by their magic
// bytes, whatever the file is called. A file is never read whole, so a
// multi-GB .jsonl.zst costs one buffer of memory.
#include <cstdint>
#include <memory>
#include <string>

namespace meshtrain::detail {

enum class Compression { kNone, kGzip, kZstd };

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to n bytes into buf; 0 at the end. Throws naming the file on corrupt data.
  virtual size_t read(char* buf, size_t n) = 0;
  // Compressed bytes consumed so far (for progress against file sizes).
  virtual int64_t consumed() const = 0;
};

Compression detect_compression(const std::string& path);
std::unique_ptr<ByteSource> open_source(const std::string& path);

// Lines of a ByteSource ('\n' removed, a '\r' before it kept).
class LineReader {
 public:
  explicit LineReader(std::unique_ptr<ByteSource> src) : src_(std::move(src)) {}
  bool next(std::string& line);
  int64_t consumed() const { return src_->consumed(); }

 private:
  std::unique_ptr<ByteSource> src_;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
};

// The first n decompressed bytes of a file (to sniff its content).
std::string read_prefix(const std::string& path, size_t n);

}  // namespace meshtrain::detail
