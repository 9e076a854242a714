// Byte-level BPE: training, tiktoken vocabularies, save/load, Unicode round trips.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <set>

#include "data_test_util.h"
#include "meshtrain/core/check.h"
#include "meshtrain/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace meshtrain;
using namespace meshtrain::test;

// ---------------------------------------------------------------- tokenizer

TEST(Tokenizer, TrainedRoundTripsUnicode) {
  Tokenizer tok = Tokenizer::train(sample_documents(), 400);
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.eot(), 399);
  EXPECT_EQ(tok.token_bytes(tok.eot()), "<|endoftext|>");
  for (const auto& s : unicode_samples()) {
    auto ids = tok.encode(s);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok.eot());  // plain text never yields end-of-text
    }
    EXPECT_EQ(tok.decode(ids), s);
  }
}

TEST(Tokenizer, TrainingIsDeterministicAndLearnsCommonWords) {
  Tokenizer a = Tokenizer::train(sample_documents(), 350);
  Tokenizer b = Tokenizer::train(sample_documents(), 350);
  ASSERT_EQ(a.vocab_size(), b.vocab_size());
  for (int32_t id = 0; id < a.vocab_size(); ++id) EXPECT_EQ(a.token_bytes(id), b.token_bytes(id)) << id;
  EXPECT_EQ(a.encode(" the quick brown fox").size(), 4u);
  EXPECT_EQ(a.encode(" the").size(), 1u);
  EXPECT_EQ(a.encode(" quick").size(), 1u);
  // Compression on its own training text.
  const std::string doc = sample_documents()[7];
  EXPECT_LT(a.encode(doc).size() * 3, doc.size());
}

TEST(Tokenizer, TrainingBreaksTiesBySmallerPair) {
  // "ab" and "cd" appear equally often: (a, b) has the smaller ids and must merge first.
  Tokenizer tok = Tokenizer::train({"ab", "cd", "cd", "ab"}, 258);  // room for one merge
  ASSERT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.token_bytes(256), "ab");
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok.encode("cd"), (std::vector<int32_t>{'c', 'd'}));
}

TEST(Tokenizer, IncrementalTrainingMatchesNaiveBpe) {
  // Letters-only documents are single pre-tokenized words, so a naive BPE
  // that recounts every pair after each merge must learn the same merges.
  std::mt19937 rng(7);
  std::vector<std::string> docs;
  for (int i = 0; i < 300; ++i) {
    std::string w;
    for (size_t n = 1 + rng() % 12; n > 0; --n) w += "aabbcd"[rng() % 6];
    docs.push_back(w);
  }
  const int64_t vocab = 300;
  Tokenizer tok = Tokenizer::train(docs, vocab);

  std::vector<std::vector<int32_t>> words;
  for (const auto& d : docs) words.emplace_back(d.begin(), d.end());
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
  while (static_cast<int64_t>(bytes.size()) < vocab - 1) {
    std::map<std::pair<int32_t, int32_t>, int64_t> counts;
    for (const auto& w : words)
      for (size_t i = 0; i + 1 < w.size(); ++i) ++counts[{w[i], w[i + 1]}];
    if (counts.empty()) break;
    auto best = counts.begin();  // map order: ties go to the smaller pair
    for (auto it = counts.begin(); it != counts.end(); ++it)
      if (it->second > best->second) best = it;
    auto [l, r] = best->first;
    auto id = static_cast<int32_t>(bytes.size());
    bytes.push_back(bytes[l] + bytes[r]);
    for (auto& w : words) {
      std::vector<int32_t> out;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == l && w[i + 1] == r) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      w = out;
    }
  }
  ASSERT_EQ(tok.vocab_size(), static_cast<int64_t>(bytes.size()) + 1);
  for (int32_t id = 256; id < static_cast<int32_t>(bytes.size()); ++id) EXPECT_EQ(tok.token_bytes(id), bytes[id]) << id;
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(tok.encode(docs[i]), words[i]) << docs[i];
}

TEST(Tokenizer, SmallCorpusGivesSmallerVocabulary) {
  Tokenizer tok = Tokenizer::train({"aaaa"}, 1000);
  EXPECT_LT(tok.vocab_size(), 1000);
  EXPECT_EQ(tok.eot(), tok.vocab_size() - 1);
  EXPECT_EQ(tok.decode(tok.encode("aaaaaaa")), "aaaaaaa");
  EXPECT_NE(error_of([] { Tokenizer::train({"x"}, 100); }).find("vocab_size"), std::string::npos);
}

namespace {
// A tiny tiktoken vocabulary: bytes get ranks in reverse (so ids are not
// bytes), then "bc" (256) before "ab" (257), so merging can never reach
// "abcd" (259), though the piece "abcd" is that token whole (tiktoken looks a
// piece up before merging); "xyzw" reaches 264 through xy + zw.
std::string tiny_tiktoken(const fs::path& path) {
  auto b64 = [](const std::string& s) {
    static const char* A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 3 <= s.size(); i += 3) {
      uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
      for (int k = 18; k >= 0; k -= 6) out += A[(v >> k) & 63];
    }
    if (s.size() - i == 1) {
      uint32_t v = uint8_t(s[i]) << 16;
      out += A[(v >> 18) & 63];
      out += A[(v >> 12) & 63];
      out += "==";
    } else if (s.size() - i == 2) {
      uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
      out += A[(v >> 18) & 63];
      out += A[(v >> 12) & 63];
      out += A[(v >> 6) & 63];
      out += '=';
    }
    return out;
  };
  std::string text;
  for (int b = 0; b < 256; ++b) text += b64(std::string(1, char(b))) + " " + std::to_string(255 - b) + "\n";
  text += b64("bc") + " 256\n";
  text += b64("ab") + " 257\n";
  text += b64("cd") + " 258\n";
  text += b64("abcd") + " 259\n";
  text += b64(" hello") + " 260\n";
  text += b64(" h") + " 261\n";  // " hello" has no path from " h": "he", " he" ... are missing
  text += b64("xy") + " 262\n";
  text += b64("zw") + " 263\n";
  text += b64("xyzw") + " 264\n";
  write_text(path, text);
  return path.string();
}
}  // namespace

TEST(Tokenizer, LoadsTiktokenRanks) {
  TempDir dir;
  Tokenizer tok = Tokenizer::from_tiktoken(tiny_tiktoken(dir / "tiny.tiktoken"), "gpt2");
  EXPECT_EQ(tok.vocab_size(), 266);
  EXPECT_EQ(tok.eot(), 265);
  EXPECT_EQ(tok.encode("a"), (std::vector<int32_t>{255 - 'a'}));
  // "bc" outranks "ab": "abc" -> a, bc (no "abc" token); "abcd" is a token.
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{255 - 'a', 256}));
  EXPECT_EQ(tok.encode("abcd"), (std::vector<int32_t>{259}));
  EXPECT_EQ(tok.encode("abcdabcd"), (std::vector<int32_t>{255 - 'a', 256, 255 - 'd', 255 - 'a', 256, 255 - 'd'}));
  EXPECT_EQ(tok.encode("xyzwxyzw"), (std::vector<int32_t>{264, 264}));
  EXPECT_EQ(tok.encode(" hello"), (std::vector<int32_t>{260}));
  EXPECT_EQ(tok.encode(" hellohello"), (std::vector<int32_t>{261, 255 - 'e', 255 - 'l', 255 - 'l', 255 - 'o',
                                                              255 - 'h', 255 - 'e', 255 - 'l', 255 - 'l', 255 - 'o'}));
  for (const auto& s : unicode_samples()) EXPECT_EQ(tok.decode(tok.encode(s)), s);
  EXPECT_EQ(tok.decode({264, tok.eot()}), "xyzw<|endoftext|>");
}

TEST(Tokenizer, BadTiktokenFileIsNamed) {
  TempDir dir;
  write_text(dir / "bad.tiktoken", "YWI= 0\nnot-base64!! 1\n");
  std::string msg = error_of([&] { Tokenizer::from_tiktoken((dir / "bad.tiktoken").string(), "gpt2"); });
  EXPECT_NE(msg.find("bad.tiktoken:2"), std::string::npos) << msg;
  msg = error_of([&] { Tokenizer::from_tiktoken((dir / "missing.tiktoken").string()); });
  EXPECT_NE(msg.find("missing.tiktoken"), std::string::npos) << msg;
}

TEST(Tokenizer, SaveLoadRoundTrip) {
  TempDir dir;
  Tokenizer trained = Tokenizer::train(sample_documents(), 300);
  trained.save((dir / "bpe.json").string());
  Tokenizer tiktoken = Tokenizer::from_tiktoken(tiny_tiktoken(dir / "tiny.tiktoken"), "gpt2");
  tiktoken.save((dir / "tt.json").string());
  for (auto [orig, file] : {std::pair<const Tokenizer*, std::string>{&trained, "bpe.json"}, {&tiktoken, "tt.json"}}) {
    Tokenizer loaded = Tokenizer::load((dir / file).string());
    ASSERT_EQ(loaded.vocab_size(), orig->vocab_size()) << file;
    EXPECT_EQ(loaded.eot(), orig->eot());
    for (int32_t id = 0; id < orig->vocab_size(); ++id) EXPECT_EQ(loaded.token_bytes(id), orig->token_bytes(id));
    for (const auto& s : unicode_samples()) EXPECT_EQ(loaded.encode(s), orig->encode(s)) << file;
    EXPECT_EQ(loaded.encode(sample_documents()[3]), orig->encode(sample_documents()[3]));
  }
  auto j = nlohmann::json::parse(std::ifstream(dir / "bpe.json"));
  EXPECT_EQ(j["format"], "meshtrain-tokenizer");
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["specials"][0][0], "<|endoftext|>");
}

TEST(Tokenizer, UnknownTiktokenNeedsPattern) {
  TempDir dir;
  std::string msg = error_of([&] { Tokenizer::from_tiktoken(tiny_tiktoken(dir / "tiny.tiktoken")); });
  EXPECT_NE(msg.find("--pattern"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny.tiktoken"), std::string::npos) << msg;
  msg = error_of([&] { Tokenizer::from_tiktoken(tiny_tiktoken(dir / "tiny.tiktoken"), "(unclosed"); });
  EXPECT_NE(msg.find("does not compile"), std::string::npos) << msg;
}

TEST(Tokenizer, PublishedPatternsSplitLikeTiktoken) {
  TempDir dir;
  Tokenizer tok = Tokenizer::from_tiktoken(tiny_tiktoken(dir / "tiny.tiktoken"), "cl100k");
  EXPECT_EQ(tok.pattern_name(), "cl100k");
  EXPECT_EQ(tok.decode(tok.encode("12345")), "12345");
  Tokenizer gpt2 = Tokenizer::from_tiktoken(tiny_tiktoken(dir / "tiny.tiktoken"), "gpt2");
  EXPECT_EQ(gpt2.pattern_name(), "gpt2");
  Tokenizer custom = Tokenizer::from_tiktoken(tiny_tiktoken(dir / "tiny.tiktoken"), R"(\p{L}+|\s+|.)");
  EXPECT_EQ(custom.pattern_name(), "");
}

TEST(Tokenizer, DecodeTextIsValidUtf8) {
  Tokenizer tok = Tokenizer::train(sample_documents(), 300);
  // A cut character, a stray continuation byte, an overlong and a surrogate.
  std::vector<int32_t> ids = {'a', 0xE6, 0x97, 'b', 0x80, 'c', 0xC0, 0xAF, 0xED, 0xA0, 0x80, 0xF0, 0x9F, 0x98, 0x80};
  EXPECT_EQ(tok.decode_text(ids), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                                "\xF0\x9F\x98\x80");
  EXPECT_EQ(tok.decode_text(tok.encode("caf\xC3\xA9")), "caf\xC3\xA9");
}

TEST(Tokenizer, BadTokenizerFileIsNamed) {
  TempDir dir;
  write_text(dir / "garbage.json", "{ not json");
  write_text(dir / "other.json", R"({"format": "something-else", "version": 1})");
  write_text(dir / "future.json", R"({"format": "meshtrain-tokenizer", "version": 99})");
  write_text(dir / "badmerge.json",
             R"({"format": "meshtrain-tokenizer", "version": 1, "kind": "bpe", "merges": [[1, 999]], "eot": 257})");
  for (std::string name : {"garbage.json", "other.json", "future.json", "badmerge.json", "absent.json"}) {
    std::string msg = error_of([&] { Tokenizer::load((dir / name).string()); });
    EXPECT_NE(msg.find(name), std::string::npos) << name << ": " << msg;
  }
}

