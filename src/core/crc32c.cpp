#include "meshtrain/core/crc32c.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes,
// so 8 input bytes cost 8 lookups and no per-bit loop.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

uint32_t crc_software(uint32_t crc, const unsigned char* p, size_t n) {
  static const Tables t = make_tables();  // const after init: not mutable state
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
  return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Compiled for SSE4.2 even though the build targets baseline x86-64; only
// called after the CPU reports the instruction.
__attribute__((target("sse4.2"))) uint32_t crc_sse42(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  crc = have_sse42() ? crc_sse42(crc, p, n) : crc_software(crc, p, n);
#else
  crc = crc_software(crc, p, n);
#endif
  return ~crc;
}

uint32_t crc32c_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MT_CHECK(f, "cannot open ", path, " to checksum it: ", std::strerror(errno));
  std::vector<unsigned char> buf(size_t{8} << 20);
  uint32_t crc = 0;
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) crc = crc32c_update(crc, buf.data(), got);
  const bool failed = std::ferror(f);
  std::fclose(f);
  MT_CHECK(!failed, "read error while checksumming ", path);
  return crc;
}

std::string crc32c_string(uint32_t crc) {
  char s[20];
  std::snprintf(s, sizeof s, "crc32c:%08x", crc);
  return s;
}

}  // namespace meshtrain
