#pragma once
// Byte-level BPE tokenizer: 256 byte tokens, learned (or tiktoken-ranked)
// merges, and one special end-of-text token `<|endoftext|>` as the last id.
// Any byte string encodes, so decode(encode(s)) == s for all text.
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace meshtrain {

class Tokenizer {
 public:
  static constexpr const char* kEndOfText = "<|endoftext|>";

  // Learns merges until the vocabulary (bytes + merges + end-of-text) reaches
  // vocab_size, or fewer when the documents run out of pairs. Deterministic:
  // the most frequent pair wins, ties go to the smaller (left, right) ids.
  static Tokenizer train(const std::vector<std::string>& documents, int64_t vocab_size);
  // tiktoken file: one "base64(token bytes) rank" per line; a pair merges when
  // its concatenation is a token, lowest rank first. End-of-text gets the next id.
  static Tokenizer from_tiktoken(const std::string& path);
  // The JSON written by save() ("format": "meshtrain-tokenizer").
  static Tokenizer load(const std::string& path);
  void save(const std::string& path) const;

  // Plain text only: the characters "<|endoftext|>" in text encode as bytes,
  // never as eot(), so documents cannot forge a boundary.
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int32_t eot() const { return eot_; }
  // The bytes of one token (eot() gives "<|endoftext|>").
  const std::string& token_bytes(int32_t id) const;

 private:
  enum class Kind { kTrained, kTiktoken };
  Tokenizer() = default;
  void add_merge(int32_t left, int32_t right, int32_t merged);
  void derive_rank_merges();  // tiktoken: merges implied by the ranks of tokens_
  void finish_byte_table(const std::string& source);
  std::vector<int32_t> encode_piece(const std::string& piece) const;

  Kind kind_ = Kind::kTrained;
  std::vector<std::string> tokens_;                       // id -> bytes
  std::vector<std::pair<int32_t, int32_t>> merge_list_;   // trained: in merge order
  std::unordered_map<uint64_t, int32_t> merges_;          // (left, right) -> merged id; smaller id merges first
  std::array<int32_t, 256> byte_ids_{};                   // -1: byte not in the vocabulary
  int32_t eot_ = -1;
};

}  // namespace meshtrain
