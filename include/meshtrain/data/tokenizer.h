#pragma once
// Byte-level BPE tokenizer: byte tokens, merges with a rank each, special
// tokens (at least `<|endoftext|>`) and a pre-tokenizer regex. Three sources:
// trained here, a tiktoken vocabulary (ranks = ids; the published files are
// recognised by their sha256 and get their official pattern and special ids,
// e.g. cl100k's <|endoftext|> = 100257), or a Hugging Face byte-level BPE
// tokenizer.json (GPT-2 / Llama-3 style). Any byte string encodes, so
// decode(encode(s)) == s for all text.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace meshtrain {

namespace detail {
class Pretokenizer;
class BpeTables;
}  // namespace detail

// Pieces already encoded, reused across calls by one thread (natural text
// repeats its words, so a corpus encodes in about linear time). Bounded: it
// is cleared when it grows past max_entries.
class EncodeCache {
 public:
  explicit EncodeCache(size_t max_entries = 1 << 20) : max_entries_(max_entries) {}

 private:
  friend class Tokenizer;
  std::unordered_map<std::string, std::vector<int32_t>> map_;
  size_t max_entries_;
};

class Tokenizer {
 public:
  static constexpr const char* kEndOfText = "<|endoftext|>";

  // Learns merges until the vocabulary (bytes + merges + end-of-text) reaches
  // vocab_size, or fewer when the documents run out of pairs. Deterministic:
  // the most frequent pair wins, ties go to the smaller (left, right) ids.
  // pattern: a published pattern name (gpt2, cl100k, o200k) or a regex.
  static Tokenizer train(const std::vector<std::string>& documents, int64_t vocab_size,
                         const std::string& pattern = "gpt2");
  // tiktoken file: one "base64(token bytes) rank" per line. r50k/p50k/
  // cl100k/o200k files (known sha256) take their published pattern and
  // special tokens; any other file needs pattern ("" there is an error), and
  // gets <|endoftext|> as the next id. A non-empty pattern always wins.
  static Tokenizer from_tiktoken(const std::string& path, const std::string& pattern = "");
  // A Hugging Face tokenizer.json with a byte-level BPE model.
  static Tokenizer from_hf_json(const std::string& path);
  // meshtrain's tokenizer.json (written by save()) or a Hugging Face one.
  static Tokenizer load(const std::string& path);
  // meshtrain's JSON format ("format": "meshtrain-tokenizer", version 2).
  void save(const std::string& path) const;

  // Plain text only: special-token strings in text encode as ordinary bytes,
  // never as special ids, so documents cannot forge a boundary (tiktoken's
  // encode_ordinary).
  std::vector<int32_t> encode(std::string_view text) const;
  // Appends to out, reusing the caller's cache.
  void encode(std::string_view text, EncodeCache& cache, std::vector<int32_t>& out) const;
  // The exact bytes, which may cut a UTF-8 character between tokens.
  std::string decode(const std::vector<int32_t>& ids) const;
  // For terminals and logs: invalid or cut UTF-8 becomes U+FFFD.
  std::string decode_text(const std::vector<int32_t>& ids) const;

  // One past the largest id (ids between the vocabulary and the special
  // tokens may be unused, as in cl100k).
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int32_t eot() const { return eot_; }
  // The bytes of one token (special tokens give their name, e.g. eot() gives
  // "<|endoftext|>"; Llama-3's is "<|end_of_text|>").
  const std::string& token_bytes(int32_t id) const;
  // The pre-tokenizer regex, and its published name ("" when custom).
  const std::string& pattern() const { return pattern_; }
  std::string pattern_name() const;
  const std::vector<std::pair<std::string, int32_t>>& special_tokens() const { return specials_; }
  // How the vocabulary was made: "bpe" (trained), "tiktoken" or "hf".
  std::string kind() const;
  // Merges in rank order as (left, right, merged) ids.
  std::vector<std::array<int32_t, 3>> merges() const;
  // true when a piece that is itself a token encodes as that token without
  // merging (tiktoken; HF's ignore_merges).
  bool whole_piece_lookup() const { return whole_piece_lookup_; }

 private:
  enum class Kind { kTrained, kTiktoken, kHf };
  Tokenizer() = default;
  // Builds the pre-tokenizer and lookup tables once tokens_, merges, specials
  // and pattern_ are set; source names the file in errors.
  void finish(const std::string& source);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  Kind kind_ = Kind::kTrained;
  std::vector<std::string> tokens_;                                 // id -> bytes ("" for unused ids)
  std::vector<std::array<int32_t, 3>> merges_;                      // rank order
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::string pattern_;
  bool whole_piece_lookup_ = false;
  int32_t eot_ = -1;
  std::shared_ptr<const detail::Pretokenizer> pretokenizer_;
  std::shared_ptr<const detail::BpeTables> tables_;                 // immutable, shared by copies
};

// A vocabulary file as a user names it: *.json is meshtrain's or Hugging
// Face's tokenizer.json, anything else a tiktoken file. pattern (a name or a
// regex) overrides the tiktoken file's; JSON files carry their own.
Tokenizer load_tokenizer(const std::string& path, const std::string& pattern = "");

// The Hugging Face tokenizers JSON of tok (BPE model, byte-level, the same
// pre-tokenizer regex and special tokens): tokenizers.Tokenizer.from_file
// loads it and gives the same ids.
std::string to_hf_tokenizer_json(const Tokenizer& tok);

}  // namespace meshtrain
