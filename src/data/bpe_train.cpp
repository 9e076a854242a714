// Tokenizer::train: byte-level BPE over the table of unique pre-tokenized
// words. Pair counts are kept incrementally (a merge only revisits the words
// that contain the merged pair) and the best pair comes from a lazy max-heap,
// so a few thousand merges over a few MB of text take seconds on one core.
#include <cstdint>
#include <limits>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "meshtrain/core/check.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/data/tokenizer.h"
#include "pretokenize.h"

namespace meshtrain {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t key_left(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t key_right(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
  int64_t visited = -1;  // last merge step that rewrote it, to skip duplicates
};

// Heap entry: a pair with the count it had when pushed. Stale entries (count
// changed since) are skipped on pop; each change pushes a fresh entry.
struct Candidate {
  int64_t count;
  uint64_t key;
  bool operator<(const Candidate& o) const {
    // Max-heap on count; on ties the smaller pair key must come out first.
    return count != o.count ? count < o.count : key > o.key;
  }
};

class PairTable {
 public:
  explicit PairTable(std::vector<Word> words) : words_(std::move(words)) {
    for (size_t w = 0; w < words_.size(); ++w) {
      const auto& s = words_[w].symbols;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t k = pair_key(s[i], s[i + 1]);
        counts_[k] += words_[w].count;
        where_[k].push_back(static_cast<int32_t>(w));
      }
    }
    for (auto [k, c] : counts_) heap_.push({c, k});
  }

  // The most frequent pair, or false when no pair is left.
  bool best(uint64_t* key) {
    while (!heap_.empty()) {
      Candidate c = heap_.top();
      auto it = counts_.find(c.key);
      if (it != counts_.end() && it->second == c.count) {
        *key = c.key;
        return true;
      }
      heap_.pop();
    }
    return false;
  }

  void merge(uint64_t key, int32_t merged, int64_t step) {
    const int32_t left = key_left(key), right = key_right(key);
    std::vector<int32_t> words = std::move(where_[key]);
    where_.erase(key);
    std::unordered_map<uint64_t, int64_t> delta;
    for (int32_t w : words) {
      Word& word = words_[static_cast<size_t>(w)];
      if (word.visited == step) continue;
      word.visited = step;
      auto& s = word.symbols;
      bool has_pair = false;
      for (size_t i = 0; i + 1 < s.size() && !has_pair; ++i) has_pair = s[i] == left && s[i + 1] == right;
      if (!has_pair) continue;  // an earlier merge already consumed it
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= word.count;
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          s[out++] = merged;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t k = pair_key(s[i], s[i + 1]);
        delta[k] += word.count;
        // Only pairs with the new symbol are new to this word; the word is
        // already listed under its other pairs.
        if (s[i] == merged || s[i + 1] == merged) where_[k].push_back(w);
      }
    }
    for (auto [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = counts_[k];
      c += d;
      if (c <= 0) {
        // A vanished pair never returns: new adjacencies always involve the
        // newest symbol.
        counts_.erase(k);
        where_.erase(k);
      } else {
        heap_.push({c, k});
      }
    }
  }

 private:
  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;
  std::priority_queue<Candidate> heap_;
};

std::vector<Word> count_words(const std::vector<std::string>& documents, const detail::Pretokenizer& pre) {
  std::unordered_map<std::string_view, int64_t> counts;
  std::vector<std::string_view> pieces;
  for (const auto& doc : documents) {
    pieces.clear();
    pre.split(doc, pieces);
    for (std::string_view piece : pieces) ++counts[piece];
  }
  std::vector<Word> words;
  words.reserve(counts.size());
  for (auto [piece, count] : counts) {
    if (piece.size() < 2) continue;  // a single byte has no pair to merge
    Word w;
    w.count = count;
    for (char c : piece) w.symbols.push_back(static_cast<unsigned char>(c));
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace

Tokenizer Tokenizer::train(const std::vector<std::string>& documents, int64_t vocab_size,
                           const std::string& pattern) {
  MT_CHECK(vocab_size >= 257, "tokenizer vocab_size must be at least 257 (256 bytes + end-of-text), got ",
           vocab_size);
  MT_CHECK(vocab_size <= std::numeric_limits<int32_t>::max(), "tokenizer vocab_size ", vocab_size,
           " does not fit int32 token ids");
  Tokenizer tok;
  tok.kind_ = Kind::kTrained;
  for (int b = 0; b < 256; ++b) tok.tokens_.emplace_back(1, static_cast<char>(b));
  tok.pattern_ = detail::resolve_pattern(pattern);
  PairTable table(count_words(documents, detail::Pretokenizer(tok.pattern_)));
  int64_t step = 0;
  uint64_t key = 0;
  while (static_cast<int64_t>(tok.tokens_.size()) < vocab_size - 1 && table.best(&key)) {
    auto merged = static_cast<int32_t>(tok.tokens_.size());
    int32_t l = key_left(key), r = key_right(key);
    tok.merges_.push_back({l, r, merged});
    tok.tokens_.push_back(tok.tokens_[static_cast<size_t>(l)] + tok.tokens_[static_cast<size_t>(r)]);
    table.merge(key, merged, step++);
    if (step % 64 == 0) throw_if_stop_requested("prepare-data (training the tokenizer)");
  }
  // Documents that run out of pairs give a smaller vocabulary; callers see it
  // in vocab_size().
  tok.eot_ = static_cast<int32_t>(tok.tokens_.size());
  tok.tokens_.emplace_back(kEndOfText);
  tok.specials_ = {{kEndOfText, tok.eot_}};
  tok.finish("trained tokenizer");
  return tok;
}

}  // namespace meshtrain
