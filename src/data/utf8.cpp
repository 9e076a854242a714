#include "utf8.h"

#include "pretokenize.h"

namespace meshtrain::detail {

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    size_t valid = valid_utf8_prefix(bytes.substr(i));
    out.append(bytes.data() + i, valid);
    i += valid;
    if (i >= n) break;
    // Length of the maximal subpart: the lead byte plus the continuation
    // bytes that could still have completed a valid character.
    unsigned c = s[i];
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
    size_t k = 1;
    if (len > 1) {
      unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
      unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
      if (i + 1 < n && s[i + 1] >= lo && s[i + 1] <= hi) {
        k = 2;
        while (k < len && i + k < n && (s[i + k] & 0xC0) == 0x80) ++k;
      }
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

}  // namespace meshtrain::detail
