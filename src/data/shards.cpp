#include "meshtrain/data/shards.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "meshtrain/core/check.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/fs.h"
#include "meshtrain/data/tokenizer_fingerprint.h"

namespace fs = std::filesystem;

namespace meshtrain {
namespace {

constexpr int64_t kHeaderBytes = kShardHeaderInts * 4;

// Shards are little-endian on disk; every machine we run on is too, so the
// bytes are copied as they are.
template <class T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Value of `key` in a numpy header dict such as
// {'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }.
std::string npy_field(const std::string& header, const std::string& key, const std::string& path) {
  auto at = header.find("'" + key + "'");
  MT_CHECK(at != std::string::npos, "npy shard ", path, ": header lacks '", key, "': ", header);
  auto colon = header.find(':', at);
  MT_CHECK(colon != std::string::npos, "npy shard ", path, ": malformed header: ", header);
  size_t b = header.find_first_not_of(' ', colon + 1);
  MT_CHECK(b != std::string::npos, "npy shard ", path, ": malformed header: ", header);
  size_t e;
  if (header[b] == '\'') {
    e = header.find('\'', b + 1);
    return header.substr(b + 1, e == std::string::npos ? std::string::npos : e - b - 1);
  }
  if (header[b] == '(') {
    e = header.find(')', b);
    MT_CHECK(e != std::string::npos, "npy shard ", path, ": malformed shape in header: ", header);
    return header.substr(b + 1, e - b - 1);
  }
  e = header.find_first_of(",}", b);
  return header.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

// Closes a POSIX file descriptor on every path out of a read.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int version,
                 const std::string& tokenizer_fingerprint) {
  MT_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), "shard ", path, ": ",
           tokens.size(), " tokens exceed the int32 count in the llm.c header; split into more shards");
  int32_t max_token = 0;
  for (int32_t t : tokens) {
    MT_CHECK(t >= 0, "shard ", path, ": negative token id ", t);
    max_token = std::max(max_token, t);
  }
  if (version == 0) version = max_token <= 0xFFFF ? kShardVersionU16 : kShardVersionU32;
  MT_CHECK(version == kShardVersionU16 || version == kShardVersionU32, "shard ", path,
           ": version must be 1 (uint16) or 7 (uint32), got ", version);
  MT_CHECK(version == kShardVersionU32 || max_token <= 0xFFFF, "shard ", path, ": token id ", max_token,
           " does not fit version 1 (uint16); use version 7");
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = version == kShardVersionU16 ? kShardMagic : kShardMagicU32;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  if (const uint64_t fp = fingerprint_bits(tokenizer_fingerprint)) {
    header[3] = kShardFingerprintTag;
    header[4] = static_cast<int32_t>(static_cast<uint32_t>(fp & 0xFFFFFFFFu));
    header[5] = static_cast<int32_t>(static_cast<uint32_t>(fp >> 32));
  }
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MT_CHECK(out, "cannot create shard ", tmp);
    out.write(reinterpret_cast<const char*>(header.data()), kHeaderBytes);
    if (version == kShardVersionU16) {
      std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      out.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    } else {
      out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    }
    MT_CHECK(out.good(), "error writing shard ", tmp, ": ", write_failure(errno));
  }
  fs::rename(tmp, path);
}

ShardReader::ShardReader(std::string path, int64_t vocab_size, ShardFormat format)
    : path_(std::move(path)), vocab_size_(vocab_size) {
  std::ifstream in(path_, std::ios::binary);
  MT_CHECK(in, "cannot open shard ", path_);
  struct stat st{};
  MT_CHECK(::stat(path_.c_str(), &st) == 0, "cannot stat shard ", path_, ": ", std::strerror(errno));
  stamp_ = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<int64_t>(st.st_size),
            mtime_ns(st)};
  const auto file_size = static_cast<int64_t>(st.st_size);
  if (fs::path(path_).extension() == ".npy") {
    char pre[10];
    MT_CHECK(in.read(pre, 10) && std::memcmp(pre, "\x93NUMPY", 6) == 0, "shard ", path_,
             " is not a .npy file (bad magic)");
    int major = static_cast<unsigned char>(pre[6]);
    int64_t header_len;
    int64_t prefix = 10;
    if (major == 1) {
      header_len = load_le<uint16_t>(pre + 8);
    } else {
      MT_CHECK(major == 2 || major == 3, "npy shard ", path_, ": unsupported format version ", major);
      char extra[2];
      MT_CHECK(in.read(extra, 2), "npy shard ", path_, " is truncated in its header");
      char len4[4] = {pre[8], pre[9], extra[0], extra[1]};
      header_len = load_le<uint32_t>(len4);
      prefix = 12;
    }
    MT_CHECK(prefix + header_len <= file_size, "npy shard ", path_, " is truncated in its header");
    std::string header(static_cast<size_t>(header_len), '\0');
    MT_CHECK(in.read(header.data(), header_len), "npy shard ", path_, " is truncated in its header");
    // Any integer dtype: '<' or '|' (byte order irrelevant) little-endian,
    // i or u, 1/2/4/8 bytes.
    std::string descr = npy_field(header, "descr", path_);
    MT_CHECK(descr.size() == 3 && (descr[0] == '<' || descr[0] == '|' || (descr[0] == '=' && descr[2] == '1')) &&
                 (descr[1] == 'i' || descr[1] == 'u') &&
                 (descr[2] == '1' || descr[2] == '2' || descr[2] == '4' || descr[2] == '8'),
             "npy shard ", path_, ": dtype '", descr,
             "' is not a little-endian integer type (expected e.g. <u2, <i4, <u4, <i8)");
    item_size_ = descr[2] - '0';
    item_signed_ = descr[1] == 'i';
    MT_CHECK(npy_field(header, "fortran_order", path_) == "False", "npy shard ", path_,
             ": fortran_order arrays are not supported");
    std::string shape = npy_field(header, "shape", path_);
    shape.erase(std::remove(shape.begin(), shape.end(), ' '), shape.end());
    if (!shape.empty() && shape.back() == ',') shape.pop_back();
    // (N, 1) is a column of tokens, as some exporters write it.
    if (shape.size() > 2 && shape.compare(shape.size() - 2, 2, ",1") == 0) shape.resize(shape.size() - 2);
    MT_CHECK(!shape.empty() && shape.find_first_not_of("0123456789") == std::string::npos, "npy shard ", path_,
             ": expected shape (N,) or (N, 1), got (", shape, ")");
    MT_CHECK(shape.size() <= 15, "npy shard ", path_, ": implausible length ", shape);
    num_tokens_ = std::stoll(shape);
    data_offset_ = prefix + header_len;
  } else if (format == ShardFormat::kNanoGpt) {
    // nanoGPT's prepare.py: np.uint16 tokens, no header at all.
    MT_CHECK(file_size % 2 == 0, "nanoGPT shard ", path_, " has an odd size (", file_size,
             " bytes): not raw uint16 tokens");
    item_size_ = 2;
    num_tokens_ = file_size / 2;
    data_offset_ = 0;
  } else {
    MT_CHECK(file_size >= kHeaderBytes, "shard ", path_, " is truncated: ", file_size,
             " bytes, shorter than the ", kHeaderBytes,
             "-byte llm.c header (nanoGPT's headerless train.bin needs data_config.format: \"nanogpt\")");
    std::vector<int32_t> header(kShardHeaderInts);
    in.read(reinterpret_cast<char*>(header.data()), kHeaderBytes);
    MT_CHECK(header[0] == kShardMagic || header[0] == kShardMagicU32, "shard ", path_, " has bad magic ",
             header[0], " (expected ", kShardMagic, " or ", kShardMagicU32,
             "): not an llm.c token shard (nanoGPT's headerless train.bin needs data_config.format: \"nanogpt\")");
    const bool u16 = header[0] == kShardMagic && header[1] == kShardVersionU16;
    const bool u32 = (header[0] == kShardMagicU32 && header[1] == kShardVersionU32) ||
                     (header[0] == kShardMagic && header[1] == 2);  // meshtrain's pre-v7 uint32 files
    MT_CHECK(u16 || u32, "shard ", path_, " has magic ", header[0], " with unsupported version ", header[1],
             " (expected 20240520 v1 = uint16, 20240801 v7 = uint32, or meshtrain's old 20240520 v2)");
    MT_CHECK(header[2] >= 0, "shard ", path_, " has a negative token count ", header[2]);
    item_size_ = u16 ? 2 : 4;
    item_signed_ = false;
    num_tokens_ = header[2];
    if (header[3] == kShardFingerprintTag)
      fingerprint_ = fingerprint_string(uint64_t{static_cast<uint32_t>(header[4])} |
                                        uint64_t{static_cast<uint32_t>(header[5])} << 32);
    data_offset_ = kHeaderBytes;
  }
  const int64_t expected = data_offset_ + num_tokens_ * item_size_;
  MT_CHECK(file_size == expected, "shard ", path_, (file_size < expected ? " is truncated" : " has trailing bytes"),
           ": its header says ", num_tokens_, " tokens (", expected, " bytes) but the file has ", file_size,
           " bytes");
}

void ShardReader::pread_all(int fd, int64_t offset, std::vector<char>& out, int64_t begin, int64_t count) const {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset) + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    MT_CHECK(n > 0, "shard ", path_, ": short read of tokens [", begin, ", ", begin + count, ") (",
             n < 0 ? std::strerror(errno) : "end of file", ")");
    done += static_cast<size_t>(n);
  }
}

void ShardReader::check_blocks(int fd, int64_t offset, const std::vector<char>& bytes) const {
  std::lock_guard<std::mutex> lock(sums_->mu);
  if (sums_->crcs.empty()) {
    // The first read: the whole file as it is now is the reference, a block
    // at a time (a nanoGPT train.bin may be larger than memory).
    std::vector<char> block;
    for (int64_t b = 0; b < stamp_.size; b += kShardCheckBlock) {
      block.resize(static_cast<size_t>(std::min(kShardCheckBlock, stamp_.size - b)));
      pread_all(fd, b, block, 0, num_tokens_);
      sums_->crcs.push_back(crc32c(block.data(), block.size()));
    }
  }
  for (int64_t b = 0; b < static_cast<int64_t>(bytes.size()); b += kShardCheckBlock) {
    const int64_t n = std::min<int64_t>(kShardCheckBlock, static_cast<int64_t>(bytes.size()) - b);
    const auto index = static_cast<size_t>((offset + b) / kShardCheckBlock);
    MT_CHECK(crc32c(bytes.data() + b, static_cast<size_t>(n)) == sums_->crcs.at(index), "shard ", path_,
             " changed on disk since training first read it (rewritten in place, its size and modification time ",
             "kept: bytes [", offset + b, ", ", offset + b + n, ") differ): stopping rather than training on other ",
             "tokens. Restart the run to use the new data (a checkpoint made with another tokenizer is refused on ",
             "resume)");
  }
}

std::vector<int32_t> ShardReader::read(int64_t begin, int64_t count) const {
  MT_CHECK(begin >= 0 && count >= 0 && begin + count <= num_tokens_, "shard ", path_, ": tokens [", begin, ", ",
           begin + count, ") are outside its ", num_tokens_, " tokens");
  // The file must still be the one whose header was read: a shard replaced
  // under a running train (prepare-data over its data_dir) holds other
  // tokens, perhaps of another tokenizer, at the same offsets.
  const Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  MT_CHECK(f.fd >= 0, "shard ", path_, " cannot be opened any more (", std::strerror(errno),
           "): it was removed or replaced since training opened it (prepare-data run again over the data?); "
           "stopping rather than training on other data");
  struct stat st{};
  MT_CHECK(::fstat(f.fd, &st) == 0, "cannot stat shard ", path_, ": ", std::strerror(errno));
  const Stamp now{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                  static_cast<int64_t>(st.st_size), mtime_ns(st)};
  MT_CHECK(now == stamp_, "shard ", path_, " changed on disk since training opened it (",
           now.inode != stamp_.inode || now.device != stamp_.device ? "replaced by another file"
                                                                    : "rewritten in place",
           ", ", stamp_.size, " -> ", now.size, " bytes; prepare-data run again over the data?): stopping rather "
           "than training on other tokens. Restart the run to use the new data (a checkpoint made with another "
           "tokenizer is refused on resume)");
  // Whole blocks around the tokens, so each can be checked against its sum.
  const int64_t lo = data_offset_ + begin * item_size_, hi = lo + count * item_size_;
  const int64_t from = lo / kShardCheckBlock * kShardCheckBlock;
  const int64_t to =
      count == 0 ? from : std::min(stamp_.size, (hi + kShardCheckBlock - 1) / kShardCheckBlock * kShardCheckBlock);
  std::vector<char> block_bytes(static_cast<size_t>(to - from));
  pread_all(f.fd, from, block_bytes, begin, count);
  check_blocks(f.fd, from, block_bytes);
  const char* raw = block_bytes.data() + (lo - from);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  const int64_t limit = vocab_size_ > 0 ? vocab_size_ : std::numeric_limits<int32_t>::max();
  for (int64_t i = 0; i < count; ++i) {
    const char* p = raw + i * item_size_;
    int64_t v;
    switch (item_size_) {
      case 1: v = item_signed_ ? int64_t{static_cast<int8_t>(*p)} : int64_t{static_cast<uint8_t>(*p)}; break;
      case 2: v = item_signed_ ? int64_t{load_le<int16_t>(p)} : int64_t{load_le<uint16_t>(p)}; break;
      case 4: v = item_signed_ ? int64_t{load_le<int32_t>(p)} : int64_t{load_le<uint32_t>(p)}; break;
      default: {
        uint64_t u = load_le<uint64_t>(p);
        // A uint64 above INT64_MAX is out of range either way.
        v = !item_signed_ && u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1
                                                                                          : static_cast<int64_t>(u);
      }
    }
    MT_CHECK(v >= 0 && v < limit, "shard ", path_, ": token ", v, " at position ", begin + i,
             (vocab_size_ > 0 ? " is outside the vocabulary of " : " does not fit int32, limit "), limit,
             (vocab_size_ > 0 ? " (shard prepared with a different tokenizer?)" : ""));
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return tokens;
}

std::vector<int32_t> read_shard(const std::string& path, int64_t vocab_size, ShardFormat format) {
  return ShardReader(path, vocab_size, format).read_all();
}

std::vector<std::string> list_shards(const std::string& folder) {
  std::error_code ec;
  MT_CHECK(fs::is_directory(folder, ec), "shard folder ", folder,
           " does not exist or is not a folder (run `meshtrain prepare-data` first?)");
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(folder)) {
    auto ext = entry.path().extension();
    if (entry.is_regular_file() && (ext == ".bin" || ext == ".npy")) shards.push_back(entry.path().string());
  }
  MT_CHECK(!shards.empty(), "shard folder ", folder, " holds no *.bin or *.npy shards");
  std::sort(shards.begin(), shards.end());
  return shards;
}

}  // namespace meshtrain
