#pragma once
// SHA-256 (FIPS 180-4), to recognise published vocabulary files by the hashes
// tiktoken itself checks them against.
#include <string>
#include <string_view>

namespace meshtrain::detail {

// Lower-case hex digest.
std::string sha256_hex(std::string_view data);

}  // namespace meshtrain::detail
