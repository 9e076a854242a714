#include "meshtrain/data/shards.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "meshtrain/core/check.h"

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

}  // namespace

void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int version) {
  MT_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), "shard ", path, ": ",
           tokens.size(), " tokens exceed the int32 count in the llm.c header; split into more shards");
  int32_t max_token = 0;
  for (int32_t t : tokens) {
    MT_CHECK(t >= 0, "shard ", path, ": negative token id ", t);
    max_token = std::max(max_token, t);
  }
  if (version == 0) version = max_token <= 0xFFFF ? 1 : 2;
  MT_CHECK(version == 1 || version == 2, "shard ", path, ": version must be 1 (uint16) or 2 (uint32), got ",
           version);
  MT_CHECK(version == 2 || max_token <= 0xFFFF, "shard ", path, ": token id ", max_token,
           " does not fit version 1 (uint16); use version 2");
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MT_CHECK(out, "cannot create shard ", tmp);
    out.write(reinterpret_cast<const char*>(header.data()), kHeaderBytes);
    if (version == 1) {
      std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      out.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    } else {
      out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    }
    MT_CHECK(out.good(), "error writing shard ", tmp, " (disk full?)");
  }
  fs::rename(tmp, path);
}

ShardReader::ShardReader(std::string path, int64_t vocab_size)
    : path_(std::move(path)), vocab_size_(vocab_size) {
  std::ifstream in(path_, std::ios::binary);
  MT_CHECK(in, "cannot open shard ", path_);
  std::error_code ec;
  const auto file_size = static_cast<int64_t>(fs::file_size(path_, ec));
  MT_CHECK(!ec, "cannot stat shard ", path_, ": ", ec.message());
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
    std::string descr = npy_field(header, "descr", path_);
    if (descr == "<u2") { item_size_ = 2; item_signed_ = false; }
    else if (descr == "<i4") { item_size_ = 4; item_signed_ = true; }
    else if (descr == "<u4") { item_size_ = 4; item_signed_ = false; }
    else if (descr == "<i8") { item_size_ = 8; item_signed_ = true; }
    else MT_FAIL("npy shard ", path_, ": dtype '", descr, "' is not supported (use <u2, <i4, <u4 or <i8)");
    MT_CHECK(npy_field(header, "fortran_order", path_) == "False", "npy shard ", path_,
             ": fortran_order arrays are not supported");
    std::string shape = npy_field(header, "shape", path_);
    shape.erase(std::remove(shape.begin(), shape.end(), ' '), shape.end());
    if (!shape.empty() && shape.back() == ',') shape.pop_back();
    MT_CHECK(!shape.empty() && shape.find_first_not_of("0123456789") == std::string::npos, "npy shard ", path_,
             ": expected a 1-D array, shape is (", shape, ")");
    MT_CHECK(shape.size() <= 15, "npy shard ", path_, ": implausible length ", shape);
    num_tokens_ = std::stoll(shape);
    data_offset_ = prefix + header_len;
  } else {
    MT_CHECK(file_size >= kHeaderBytes, "shard ", path_, " is truncated: ", file_size,
             " bytes, shorter than the ", kHeaderBytes, "-byte header");
    std::vector<int32_t> header(kShardHeaderInts);
    in.read(reinterpret_cast<char*>(header.data()), kHeaderBytes);
    MT_CHECK(header[0] == kShardMagic, "shard ", path_, " has bad magic ", header[0], " (expected ",
             kShardMagic, "): not an llm.c token shard");
    MT_CHECK(header[1] == 1 || header[1] == 2, "shard ", path_, " has unsupported version ", header[1],
             " (expected 1 = uint16 or 2 = uint32)");
    MT_CHECK(header[2] >= 0, "shard ", path_, " has a negative token count ", header[2]);
    item_size_ = header[1] == 1 ? 2 : 4;
    item_signed_ = false;
    num_tokens_ = header[2];
    data_offset_ = kHeaderBytes;
  }
  const int64_t expected = data_offset_ + num_tokens_ * item_size_;
  MT_CHECK(file_size == expected, "shard ", path_, (file_size < expected ? " is truncated" : " has trailing bytes"),
           ": its header says ", num_tokens_, " tokens (", expected, " bytes) but the file has ", file_size,
           " bytes");
}

std::vector<int32_t> ShardReader::read(int64_t begin, int64_t count) const {
  MT_CHECK(begin >= 0 && count >= 0 && begin + count <= num_tokens_, "shard ", path_, ": tokens [", begin, ", ",
           begin + count, ") are outside its ", num_tokens_, " tokens");
  std::ifstream in(path_, std::ios::binary);
  MT_CHECK(in, "cannot open shard ", path_);
  std::vector<char> raw(static_cast<size_t>(count * item_size_));
  in.seekg(data_offset_ + begin * item_size_);
  MT_CHECK(in.read(raw.data(), static_cast<std::streamsize>(raw.size())), "shard ", path_,
           ": short read of tokens [", begin, ", ", begin + count, ") (file changed while training?)");
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  const int64_t limit = vocab_size_ > 0 ? vocab_size_ : std::numeric_limits<int32_t>::max();
  for (int64_t i = 0; i < count; ++i) {
    const char* p = raw.data() + i * item_size_;
    int64_t v = item_size_ == 2 ? load_le<uint16_t>(p)
                : item_size_ == 8 ? load_le<int64_t>(p)
                : item_signed_ ? load_le<int32_t>(p)
                               : static_cast<int64_t>(load_le<uint32_t>(p));
    MT_CHECK(v >= 0 && v < limit, "shard ", path_, ": token ", v, " at position ", begin + i,
             (vocab_size_ > 0 ? " is outside the vocabulary of " : " does not fit int32, limit "), limit,
             (vocab_size_ > 0 ? " (shard prepared with a different tokenizer?)" : ""));
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return tokens;
}

std::vector<int32_t> read_shard(const std::string& path, int64_t vocab_size) {
  return ShardReader(path, vocab_size).read_all();
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
