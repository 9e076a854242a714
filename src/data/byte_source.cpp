#include "byte_source.h"

#include <cstdint>
#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "meshtrain/core/check.h"

namespace meshtrain::detail {
namespace {

constexpr size_t kChunk = 1 << 18;

class FileSource : public ByteSource {
 public:
  explicit FileSource(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    MT_CHECK(in_, "cannot open input file ", path);
  }
  size_t read(char* buf, size_t n) override {
    in_.read(buf, static_cast<std::streamsize>(n));
    MT_CHECK(!in_.bad(), "error reading input file ", path_);
    auto got = static_cast<size_t>(in_.gcount());
    consumed_ += static_cast<int64_t>(got);
    return got;
  }
  int64_t consumed() const override { return consumed_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  int64_t consumed_ = 0;
};

class GzipSource : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : file_(path), in_(kChunk) {
    std::memset(&z_, 0, sizeof(z_));
    // 15 + 32: a zlib or gzip header, detected automatically.
    MT_CHECK(inflateInit2(&z_, 15 + 32) == Z_OK, "zlib: cannot start decompressing ", path);
  }
  ~GzipSource() override { inflateEnd(&z_); }
  size_t read(char* buf, size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(buf);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out == n && !done_) {
      if (z_.avail_in == 0) {
        size_t got = file_.read(in_.data(), in_.size());
        if (got == 0) {
          MT_CHECK(at_member_end_, "gzip input ", file_.path(), " is truncated");
          done_ = true;
          break;
        }
        z_.next_in = reinterpret_cast<Bytef*>(in_.data());
        z_.avail_in = static_cast<uInt>(got);
      }
      int rc = inflate(&z_, Z_NO_FLUSH);
      at_member_end_ = false;
      if (rc == Z_STREAM_END) {
        // Another gzip member may follow (pigz, cat a.gz b.gz).
        at_member_end_ = true;
        MT_CHECK(inflateReset(&z_) == Z_OK, "zlib: cannot continue after a member of ", file_.path());
      } else {
        MT_CHECK(rc == Z_OK || rc == Z_BUF_ERROR, "gzip input ", file_.path(), " is corrupt: ",
                 z_.msg ? z_.msg : "inflate error");
      }
    }
    return n - z_.avail_out;
  }
  int64_t consumed() const override { return file_.consumed(); }

 private:
  FileSource file_;
  std::vector<char> in_;
  z_stream z_;
  bool done_ = false, at_member_end_ = true;
};

class ZstdSource : public ByteSource {
 public:
  explicit ZstdSource(const std::string& path) : file_(path), in_(kChunk), ctx_(ZSTD_createDStream()) {
    MT_CHECK(ctx_ != nullptr, "zstd: cannot start decompressing ", path);
    ZSTD_initDStream(ctx_);
  }
  ~ZstdSource() override { ZSTD_freeDStream(ctx_); }
  size_t read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0 && !done_) {
      if (input_.pos == input_.size) {
        size_t got = file_.read(in_.data(), in_.size());
        if (got == 0) {
          MT_CHECK(frame_done_, "zstd input ", file_.path(), " is truncated");
          done_ = true;
          break;
        }
        input_ = ZSTD_inBuffer{in_.data(), got, 0};
      }
      size_t rc = ZSTD_decompressStream(ctx_, &out, &input_);
      MT_CHECK(!ZSTD_isError(rc), "zstd input ", file_.path(), " is corrupt: ", ZSTD_getErrorName(rc));
      frame_done_ = rc == 0;
    }
    return out.pos;
  }
  int64_t consumed() const override { return file_.consumed(); }

 private:
  FileSource file_;
  std::vector<char> in_;
  ZSTD_DStream* ctx_;
  ZSTD_inBuffer input_{nullptr, 0, 0};
  bool done_ = false, frame_done_ = true;
};

}  // namespace

Compression detect_compression(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot open input file ", path);
  unsigned char m[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(m), 4);
  if (in.gcount() >= 2 && m[0] == 0x1F && m[1] == 0x8B) return Compression::kGzip;
  if (in.gcount() == 4 && m[0] == 0x28 && m[1] == 0xB5 && m[2] == 0x2F && m[3] == 0xFD) return Compression::kZstd;
  return Compression::kNone;
}

std::unique_ptr<ByteSource> open_source(const std::string& path) {
  switch (detect_compression(path)) {
    case Compression::kGzip: return std::make_unique<GzipSource>(path);
    case Compression::kZstd: return std::make_unique<ZstdSource>(path);
    default: return std::make_unique<FileSource>(path);
  }
}

bool LineReader::next(std::string& line) {
  while (true) {
    size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos) {
      line.assign(buf_, pos_, nl - pos_);
      pos_ = nl + 1;
      return true;
    }
    if (eof_) {
      if (pos_ >= buf_.size()) return false;
      line.assign(buf_, pos_, std::string::npos);
      pos_ = buf_.size();
      return true;
    }
    buf_.erase(0, pos_);
    pos_ = 0;
    size_t old = buf_.size();
    buf_.resize(old + kChunk);
    size_t got = src_->read(buf_.data() + old, kChunk);
    buf_.resize(old + got);
    eof_ = got == 0;
  }
}

std::string read_prefix(const std::string& path, size_t n) {
  auto src = open_source(path);
  std::string out(n, '\0');
  size_t have = 0;
  while (have < n) {
    size_t got = src->read(out.data() + have, n - have);
    if (got == 0) break;
    have += got;
  }
  out.resize(have);
  return out;
}

}  // namespace meshtrain::detail
