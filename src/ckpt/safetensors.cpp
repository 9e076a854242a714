#include "meshtrain/ckpt/safetensors.h"

#include <fcntl.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "file_io.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/json_read.h"

namespace meshtrain {

// Tensor bytes go to disk as they sit in memory; the format says little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace {

// The Python reader refuses headers above 100 MB; a larger length is corruption.
constexpr int64_t kMaxHeader = 100'000'000;

const std::vector<std::pair<const char*, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<const char*, at::ScalarType>> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat},   {"F16", at::kHalf},    {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},     {"I16", at::kShort},   {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool},   {"U16", at::kUInt16},  {"U32", at::kUInt32},
      {"U64", at::kUInt64},
  };
  return table;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType t) {
  for (const auto& [name, type] : dtype_table())
    if (type == t) return name;
  MT_FAIL("dtype ", c10::toString(t), " has no safetensors name");
}

at::ScalarType safetensors_dtype(const std::string& name) {
  for (const auto& [n, type] : dtype_table())
    if (name == n) return type;
  MT_FAIL("unsupported safetensors dtype \"", name, "\"");
}

SafetensorsDigest write_safetensors(const std::string& path,
                                    const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in write order, which is also offset order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(t.defined(), "tensor \"", name, "\" for ", path, " is undefined");
    MT_CHECK(name != "__metadata__" && !header.contains(name), "tensor name \"", name,
             "\" is reserved or appears twice in ", path);
    const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  ckpt_io::OutFile out(path);
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (const auto& entry : tensors) {
    // One tensor at a time in host memory: a checkpoint never holds two copies of the model.
    const at::Tensor cpu = entry.second.to(at::kCPU).contiguous();
    out.write(cpu.data_ptr(), cpu.numel() * cpu.element_size());
  }
  const auto d = out.finish();
  return {d.bytes, d.crc32c};
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::pair<int64_t, std::string>> by_offset;
  for (const auto& [name, e] : entries_) by_offset.emplace_back(e.begin, name);
  std::sort(by_offset.begin(), by_offset.end());
  std::vector<std::string> out;
  for (auto& p : by_offset) out.push_back(std::move(p.second));
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  MT_CHECK(it != entries_.end(), "no tensor \"", name, "\" in ", path_);
  return it->second;
}

at::Tensor SafetensorsFile::get(const std::string& name) const {
  const Entry& e = entry(name);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, "cannot open ", path_, ": ", std::strerror(errno));
  auto* p = static_cast<char*>(t.data_ptr());
  int64_t pos = e.begin;
  while (pos < e.end) {
    const ssize_t r = ::pread(fd, p, static_cast<size_t>(e.end - pos), pos);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = errno;
      ::close(fd);
      MT_FAIL("cannot read tensor \"", name, "\" from ", path_, ": ",
              r == 0 ? "file is truncated" : std::strerror(err));
    }
    p += r;
    pos += r;
  }
  ::close(fd);
  return t;
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  MT_CHECK(!ec, "cannot open safetensors file ", path, ": ", ec.message());
  MT_CHECK(size >= 8, "safetensors file ", path, " is truncated (", size, " bytes, no header)");

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  unsigned char len[8];
  const bool got_len = ::pread(fd, len, 8, 0) == 8;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  std::string text;
  bool got_header = false;
  if (got_len && n <= static_cast<uint64_t>(std::min(size - 8, kMaxHeader))) {
    text.resize(n);
    got_header = ::pread(fd, text.data(), n, 8) == static_cast<ssize_t>(n);
  }
  ::close(fd);
  MT_CHECK(got_len, "cannot read the header length of ", path);
  MT_CHECK(n <= static_cast<uint64_t>(size - 8), "safetensors file ", path, " is truncated or corrupt: header of ",
           n, " bytes in a file of ", size);
  MT_CHECK(static_cast<int64_t>(n) <= kMaxHeader, "safetensors header of ", path, " is too large (", n, " bytes)");
  MT_CHECK(got_header, "cannot read the header of ", path);

  const nlohmann::json header = parse_json_text(text, "the safetensors header of", path);
  MT_CHECK(header.is_object(), "bad safetensors header in ", path, ": not a JSON object");

  SafetensorsFile file;
  file.path_ = path;
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      MT_CHECK(v.is_object(), "bad __metadata__ in ", path, ": not an object");
      for (const auto& [k, s] : v.items()) {
        MT_CHECK(s.is_string(), "bad __metadata__ in ", path, ": value of \"", k, "\" is not a string");
        file.metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    try {
      SafetensorsFile::Entry e;
      e.dtype = safetensors_dtype(v.at("dtype").get<std::string>());
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      const auto off = v.at("data_offsets").get<std::vector<int64_t>>();
      MT_CHECK(off.size() == 2 && off[0] >= 0 && off[0] <= off[1], "bad data_offsets");
      for (int64_t d : e.shape) MT_CHECK(d >= 0, "negative dimension");
      const int64_t expect = numel_of(e.shape) * static_cast<int64_t>(c10::elementSize(e.dtype));
      MT_CHECK(off[1] - off[0] == expect, "data_offsets span ", off[1] - off[0], " bytes, shape and dtype need ",
               expect);
      e.begin = data_start + off[0];
      e.end = data_start + off[1];
      ranges.emplace_back(off[0], off[1]);
      file.entries_[name] = std::move(e);
    } catch (const std::exception& ex) {
      MT_FAIL("bad safetensors header in ", path, ", tensor \"", name, "\": ", ex.what());
    }
  }
  // The format packs tensors back to back; anything else is a damaged header.
  std::sort(ranges.begin(), ranges.end());
  int64_t expect_begin = 0;
  for (const auto& [b, e] : ranges) {
    MT_CHECK(b == expect_begin, "bad safetensors header in ", path, ": tensor data overlaps or leaves a gap at byte ",
             b);
    expect_begin = e;
  }
  MT_CHECK(data_start + expect_begin <= size, "safetensors file ", path, " is truncated: ", size,
           " bytes, header describes ", data_start + expect_begin);
  MT_CHECK(data_start + expect_begin == size, "safetensors file ", path, " has ", size - data_start - expect_begin,
           " bytes of trailing garbage");
  return file;
}

}  // namespace meshtrain
