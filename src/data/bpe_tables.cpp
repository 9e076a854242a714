#include "bpe_tables.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <unordered_map>

namespace meshtrain::detail {
namespace {

size_t table_size(size_t entries) {
  size_t n = 16;
  while (n < entries * 2) n <<= 1;  // load factor <= 1/2 keeps probes short
  return n;
}

}  // namespace

BpeTables::BpeTables(const std::vector<std::string>& tokens, const std::vector<std::array<int32_t, 3>>& merges,
                     const std::vector<int32_t>& specials, bool rank_is_id)
    : token_bytes_(tokens) {
  std::vector<bool> special(tokens.size(), false);
  for (int32_t id : specials) special[static_cast<size_t>(id)] = true;

  pairs_.assign(table_size(merges.size()), PairSlot{});
  pair_mask_ = pairs_.size() - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    uint64_t key = pair_key(merges[rank][0], merges[rank][1]);
    for (size_t i = mix(key) & pair_mask_;; i = (i + 1) & pair_mask_) {
      PairSlot& s = pairs_[i];
      if (s.rank < 0) {
        s = {key, rank_is_id ? merges[rank][2] : static_cast<int32_t>(rank), merges[rank][2]};
        break;
      }
      if (s.key == key) break;  // listed before with a better rank
    }
  }

  byte_ids_.fill(-1);
  size_t n_tokens = 0;
  for (size_t id = 0; id < tokens.size(); ++id) n_tokens += !tokens[id].empty() && !special[id];
  token_slots_.assign(table_size(n_tokens), -1);
  token_mask_ = token_slots_.size() - 1;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& t = tokens[id];
    if (t.empty() || special[id]) continue;
    if (t.size() == 1 && byte_ids_[static_cast<unsigned char>(t[0])] < 0) {
      byte_ids_[static_cast<unsigned char>(t[0])] = static_cast<int32_t>(id);
    }
    for (size_t i = std::hash<std::string_view>()(t) & token_mask_;; i = (i + 1) & token_mask_) {
      if (token_slots_[i] < 0) {
        token_slots_[i] = static_cast<int32_t>(id);
        break;
      }
      if (token_bytes_[static_cast<size_t>(token_slots_[i])] == t) break;  // first id wins
    }
  }
}

int32_t BpeTables::token(std::string_view piece) const {
  for (size_t i = std::hash<std::string_view>()(piece) & token_mask_;; i = (i + 1) & token_mask_) {
    int32_t id = token_slots_[i];
    if (id < 0) return -1;
    if (token_bytes_[static_cast<size_t>(id)] == piece) return id;
  }
}

std::vector<std::array<int32_t, 3>> merges_from_ranks(const std::vector<std::string>& tokens) {
  std::unordered_map<std::string_view, int32_t> ids;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!tokens[id].empty()) ids.emplace(tokens[id], static_cast<int32_t>(id));
  }
  std::vector<std::array<int32_t, 3>> merges;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string_view t = tokens[id];
    for (size_t k = 1; k < t.size(); ++k) {
      auto left = ids.find(t.substr(0, k));
      if (left == ids.end()) continue;
      auto right = ids.find(t.substr(k));
      if (right != ids.end()) merges.push_back({left->second, right->second, static_cast<int32_t>(id)});
    }
  }
  return merges;
}

}  // namespace meshtrain::detail
