#pragma once
// The lookup tables behind Tokenizer::encode, built once per tokenizer and
// then read-only (shared by copies and threads). Open addressing over flat
// arrays: a merge lookup is one or two probes into a cache-friendly vector,
// several times faster than std::unordered_map in the merge loop.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::detail {

// The merges implied by a rank-ordered vocabulary (tiktoken files, byte-level
// BPE without an explicit merge list): a pair merges exactly when its
// concatenation is a token, with that token's id as priority, so every split
// of every token is listed. tokens: id -> bytes, "" for unused ids.
std::vector<std::array<int32_t, 3>> merges_from_ranks(const std::vector<std::string>& tokens);

class BpeTables {
 public:
  struct Merge {
    int32_t rank = -1;  // -1: no merge
    int32_t id = -1;
  };

  // merges: (left, right, merged) in rank order; the first listing of a
  // pair wins. rank_is_id: a merge's rank is the merged id (tiktoken, where
  // every split of a token shares its rank; trained) rather than its index. tokens: id -> bytes; ids in `specials` are left out of the
  // byte and whole-token lookups.
  BpeTables(const std::vector<std::string>& tokens, const std::vector<std::array<int32_t, 3>>& merges,
            const std::vector<int32_t>& specials, bool rank_is_id);

  Merge merge(int32_t left, int32_t right) const {
    uint64_t key = pair_key(left, right);
    for (size_t i = mix(key) & pair_mask_;; i = (i + 1) & pair_mask_) {
      const PairSlot& s = pairs_[i];
      if (s.rank < 0) return {};
      if (s.key == key) return {s.rank, s.id};
    }
  }
  // The id whose bytes are exactly piece, or -1.
  int32_t token(std::string_view piece) const;
  // -1 when the vocabulary lacks that single byte.
  int32_t byte_id(unsigned char b) const { return byte_ids_[b]; }

 private:
  struct PairSlot {
    uint64_t key = 0;
    int32_t rank = -1;
    int32_t id = -1;
  };
  static uint64_t pair_key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  static uint64_t mix(uint64_t k) {  // splitmix64 finaliser
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebULL;
    return k ^ (k >> 31);
  }

  std::vector<PairSlot> pairs_;
  size_t pair_mask_ = 0;
  std::vector<int32_t> token_slots_;  // -1 empty, else id
  size_t token_mask_ = 0;
  std::vector<std::string> token_bytes_;  // own copy, so lookups never dangle
  std::array<int32_t, 256> byte_ids_{};
};

}  // namespace meshtrain::detail
