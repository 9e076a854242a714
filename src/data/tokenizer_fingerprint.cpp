#include "meshtrain/data/tokenizer_fingerprint.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/data/tokenizer.h"
#include "hf_pattern.h"
#include "pretokenize.h"
#include "sha256.h"

namespace meshtrain {

namespace {

// Length-prefixed fields, so no two different tokenizers serialise alike.
void put_int(std::string& out, int64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF));
}
void put_bytes(std::string& out, const std::string& s) {
  put_int(out, static_cast<int64_t>(s.size()));
  out += s;
}

}  // namespace

std::string tokenizer_fingerprint(const Tokenizer& tok) {
  std::string data = "meshtrain tokenizer fingerprint v1";
  // As a Hugging Face round trip writes it (equivalent for meshtrain's regex engine).
  put_bytes(data, detail::hf_canonical_pattern(detail::resolve_pattern(tok.pattern())));
  auto specials = tok.special_tokens();
  std::sort(specials.begin(), specials.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<bool> special(static_cast<size_t>(tok.vocab_size()), false);
  for (const auto& s : specials)
    if (s.second >= 0 && s.second < tok.vocab_size()) special[static_cast<size_t>(s.second)] = true;
  put_int(data, tok.vocab_size());
  // A special id's bytes are its name in some sources and "" in others: the
  // name is hashed once, with the specials below.
  for (int32_t id = 0; id < static_cast<int32_t>(tok.vocab_size()); ++id)
    put_bytes(data, special[static_cast<size_t>(id)] ? std::string() : tok.token_bytes(id));
  const auto merges = tok.merges();
  put_int(data, static_cast<int64_t>(merges.size()));
  for (const auto& m : merges)
    for (int32_t v : m) put_int(data, v);
  put_int(data, static_cast<int64_t>(specials.size()));
  for (const auto& [name, id] : specials) {
    put_bytes(data, name);
    put_int(data, id);
  }
  put_int(data, tok.whole_piece_lookup() ? 1 : 0);
  return detail::sha256_hex(data).substr(0, 16);
}

uint64_t fingerprint_bits(const std::string& fingerprint) {
  if (fingerprint.empty()) return 0;
  MT_CHECK(fingerprint.size() == 16 && fingerprint.find_first_not_of("0123456789abcdef") == std::string::npos,
           "tokenizer fingerprint '", fingerprint, "' is not 16 lower-case hex digits");
  return std::stoull(fingerprint, nullptr, 16);
}

std::string fingerprint_string(uint64_t bits) {
  if (bits == 0) return "";
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

}  // namespace meshtrain
