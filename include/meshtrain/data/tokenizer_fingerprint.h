#pragma once
// Which tokenizer made a token stream: a short hash of everything that decides
// the ids, stored with the data (dataset manifest, shard headers) and with
// checkpoints, so data of another tokenizer is refused instead of trained on.
#include <cstdint>
#include <string>

namespace meshtrain {

class Tokenizer;

// 16 lower-case hex digits: the first 64 bits of SHA-256 over
//   - the pre-tokenizer regex, resolved (a published name and its regex hash alike)
//     and in the form a Hugging Face tokenizer.json keeps (hf_pattern.h),
//   - the bytes of every non-special id in id order ("" for unused ids),
//   - the merges in rank order (left, right, merged ids),
//   - the special tokens (name, id) in id order,
//   - whole_piece_lookup (a piece that is a token encodes as it, tiktoken's rule).
// Those decide encode() and decode(); nothing else is hashed: not the file
// format, nor `kind` (a tiktoken vocabulary saved as meshtrain's or Hugging
// Face's tokenizer.json is the same tokenizer and gives the same ids), nor
// paths. 64 bits fit two unused int32 slots of llm.c's shard header, and an
// accidental collision between two real tokenizers is not a practical concern.
std::string tokenizer_fingerprint(const Tokenizer& tok);

// The fingerprint as the 64-bit number shard headers store, and back; "" <-> 0
// (no fingerprint). Throws on a string that is not 16 hex digits.
uint64_t fingerprint_bits(const std::string& fingerprint);
std::string fingerprint_string(uint64_t bits);

}  // namespace meshtrain
