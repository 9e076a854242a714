// Encoding and decoding of Tokenizer. Training lives in bpe_train.cpp,
// tiktoken files in tiktoken.cpp, meshtrain's JSON in tokenizer_json.cpp and
// Hugging Face's in hf_tokenizer.cpp.
#include "meshtrain/data/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <queue>

#include "bpe_tables.h"
#include "meshtrain/core/check.h"
#include "pretokenize.h"
#include "utf8.h"

namespace meshtrain {
namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// Pieces longer than this merge with a heap (n log n) instead of rescanning
// the pair ranks after every merge (n^2, faster for short pieces).
constexpr size_t kHeapThreshold = 64;

// Long pieces (runs of whitespace or symbols, text without spaces): a linked
// list of parts and a min-heap of (rank, position) with lazy deletion. The
// smallest rank merges first, the leftmost on ties, exactly like the scan.
void merge_with_heap(const detail::BpeTables& t, std::vector<int32_t>& ids) {
  const size_t n = ids.size();
  std::vector<int32_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    next[i] = static_cast<int32_t>(i + 1);
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  struct Entry {
    int32_t rank;
    int32_t pos;
    int32_t left, right;  // the ids when pushed; a changed part makes it stale
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t i) {
    if (i < 0 || next[i] >= static_cast<int32_t>(n)) return;
    auto m = t.merge(ids[i], ids[next[i]]);
    if (m.rank >= 0) heap.push({m.rank, i, ids[i], ids[next[i]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    int32_t i = e.pos;
    if (!alive[i] || next[i] >= static_cast<int32_t>(n) || ids[i] != e.left || ids[next[i]] != e.right) continue;
    int32_t j = next[i];
    ids[i] = t.merge(ids[i], ids[j]).id;
    alive[j] = false;
    next[i] = next[j];
    if (next[j] < static_cast<int32_t>(n)) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i) {
    if (alive[i]) ids[out++] = ids[i];
  }
  ids.resize(out);
}

// tiktoken's byte_pair_merge: the adjacent pair with the smallest rank
// merges, the leftmost on ties, until no adjacent pair is a merge.
void merge_with_scan(const detail::BpeTables& t, std::vector<int32_t>& ids) {
  std::vector<int32_t> ranks(ids.size(), kNoRank);  // ranks[i]: pair (i, i+1)
  auto rank_at = [&](size_t i) {
    if (i + 1 >= ids.size()) return kNoRank;
    auto m = t.merge(ids[i], ids[i + 1]);
    return m.rank >= 0 ? m.rank : kNoRank;
  };
  for (size_t i = 0; i + 1 < ids.size(); ++i) ranks[i] = rank_at(i);
  while (ids.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < ids.size(); ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNoRank) break;
    ids[best] = t.merge(ids[best], ids[best + 1]).id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    ranks[best] = rank_at(best);
    if (best > 0) ranks[best - 1] = rank_at(best - 1);
  }
}

}  // namespace

void Tokenizer::finish(const std::string& source) {
  std::vector<int32_t> special_ids;
  bool eot_is_special = false;
  for (const auto& [name, id] : specials_) {
    MT_CHECK(id >= 0 && id < static_cast<int32_t>(tokens_.size()) && tokens_[id] == name, source,
             ": special token ", name, " has a bad id ", id);
    special_ids.push_back(id);
    eot_is_special |= id == eot_;
  }
  MT_CHECK(eot_is_special, source, ": the end-of-text id ", eot_, " is not one of the special tokens");
  tables_ = std::make_shared<const detail::BpeTables>(tokens_, merges_, special_ids, kind_ != Kind::kHf);
  for (int b = 0; b < 256; ++b) {
    MT_CHECK(tables_->byte_id(static_cast<unsigned char>(b)) >= 0, source, ": the vocabulary lacks a token for byte 0x",
             std::hex, b, " (a byte-level BPE needs all 256)");
  }
  pretokenizer_ = std::make_shared<const detail::Pretokenizer>(detail::resolve_pattern(pattern_));
  pattern_ = pretokenizer_->regex();
}

std::string Tokenizer::pattern_name() const { return detail::pattern_name(pattern_); }

std::string Tokenizer::kind() const {
  return kind_ == Kind::kTrained ? "bpe" : kind_ == Kind::kTiktoken ? "tiktoken" : "hf";
}

std::vector<std::array<int32_t, 3>> Tokenizer::merges() const { return merges_; }

const std::string& Tokenizer::token_bytes(int32_t id) const {
  MT_CHECK(id >= 0 && id < static_cast<int32_t>(tokens_.size()), "token id ", id,
           " is outside the vocabulary of ", tokens_.size());
  return tokens_[static_cast<size_t>(id)];
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const detail::BpeTables& t = *tables_;
  if (piece.size() == 1) {
    out.push_back(t.byte_id(static_cast<unsigned char>(piece[0])));
    return;
  }
  if (whole_piece_lookup_) {
    int32_t id = t.token(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<int32_t> ids(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) ids[i] = t.byte_id(static_cast<unsigned char>(piece[i]));
  if (ids.size() > kHeapThreshold) {
    merge_with_heap(t, ids);
  } else {
    merge_with_scan(t, ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

void Tokenizer::encode(std::string_view text, EncodeCache& cache, std::vector<int32_t>& out) const {
  std::vector<std::string_view> pieces;
  pretokenizer_->split(text, pieces);
  std::string key;
  for (std::string_view piece : pieces) {
    if (piece.size() == 1) {
      out.push_back(tables_->byte_id(static_cast<unsigned char>(piece[0])));
      continue;
    }
    // Most pieces of natural text are whole tokens of a tiktoken vocabulary:
    // one probe, no copy into the cache.
    if (whole_piece_lookup_) {
      const int32_t id = tables_->token(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    key.assign(piece);
    auto it = cache.map_.find(key);
    if (it == cache.map_.end()) {
      std::vector<int32_t> ids;
      encode_piece(piece, ids);
      if (cache.map_.size() >= cache.max_entries_) cache.map_.clear();
      it = cache.map_.emplace(key, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  EncodeCache cache;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  encode(text, cache, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::string Tokenizer::decode_text(const std::vector<int32_t>& ids) const {
  return detail::sanitize_utf8(decode(ids));
}

}  // namespace meshtrain
