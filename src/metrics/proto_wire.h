#pragma once
// The few pieces of the protobuf wire format that TensorBoard's Event message
// needs (varint, 64-bit, length-delimited, 32-bit), written out by hand so the
// build needs no protobuf compiler. Little-endian byte order is produced with
// shifts, so the host's own byte order does not matter.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "meshtrain/core/check.h"

namespace meshtrain::proto {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

inline void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

inline void put_tag(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

inline void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, kFixed64);
  put_le(out, bits, 8);
}

inline void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, kFixed32);
  put_le(out, bits, 4);
}

// int64 fields encode negatives as ten-byte two's-complement varints.
inline void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_tag(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));
}

inline void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

inline uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Walks the fields of one message; the caller interprets each by number and type.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  bool done() const { return pos_ >= data_.size(); }

  // Reads the next tag; returns the field number and sets `type`.
  uint32_t next(WireType& type) {
    const uint64_t key = varint();
    type = static_cast<WireType>(key & 7);
    MT_CHECK(type == kVarint || type == kFixed64 || type == kLengthDelimited || type == kFixed32,
             "malformed protobuf: unsupported wire type ", static_cast<int>(type), " at byte ", pos_);
    return static_cast<uint32_t>(key >> 3);
  }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      MT_CHECK(pos_ < data_.size(), "malformed protobuf: varint runs past the end");
      const auto b = static_cast<unsigned char>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    MT_FAIL("malformed protobuf: varint longer than 10 bytes");
  }

  uint64_t fixed(int bytes) {
    MT_CHECK(pos_ + bytes <= data_.size(), "malformed protobuf: fixed field runs past the end");
    const uint64_t v = get_le(data_.data() + pos_, bytes);
    pos_ += bytes;
    return v;
  }

  double as_double() {
    const uint64_t bits = fixed(8);
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }

  float as_float() {
    const auto bits = static_cast<uint32_t>(fixed(4));
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }

  std::string_view bytes() {
    const uint64_t n = varint();
    MT_CHECK(n <= data_.size() - pos_, "malformed protobuf: length ", n, " runs past the end");
    std::string_view v = data_.substr(pos_, n);
    pos_ += n;
    return v;
  }

  void skip(WireType type) {
    switch (type) {
      case kVarint: varint(); break;
      case kFixed64: fixed(8); break;
      case kFixed32: fixed(4); break;
      case kLengthDelimited: bytes(); break;
    }
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

}  // namespace meshtrain::proto
