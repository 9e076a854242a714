// Which tokenizer made the data (data/tokenizer_fingerprint.h,
// data/data_tokenizer.h): the fingerprint is stable across the tokenizer
// file formats and tells tokenizers apart; prepare-data stores it in the
// manifest and in every shard header without disturbing llm.c's readers; a
// stray shard, a replaced tokenizer.json and a blend of two tokenizers are
// refused by name; a shard replaced under a running loader stops it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "meshtrain/data/data_tokenizer.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/data/tokenizer_fingerprint.h"

namespace meshtrain {
namespace {

using test::error_of;
using test::TempDir;
using test::write_text;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A tiktoken file of the 256 bytes (reversed ranks) and a few merges.
std::string tiny_tiktoken(const fs::path& path) {
  static const char* A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto b64 = [](const std::string& s) {
    std::string out;
    size_t i = 0;
    for (; i + 3 <= s.size(); i += 3) {
      const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
      for (int k = 18; k >= 0; k -= 6) out += A[(v >> k) & 63];
    }
    if (s.size() - i == 1) {
      const uint32_t v = uint8_t(s[i]) << 16;
      out += std::string{A[(v >> 18) & 63], A[(v >> 12) & 63]} + "==";
    } else if (s.size() - i == 2) {
      const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
      out += std::string{A[(v >> 18) & 63], A[(v >> 12) & 63], A[(v >> 6) & 63]} + "=";
    }
    return out;
  };
  std::string text;
  for (int b = 0; b < 256; ++b) text += b64(std::string(1, char(b))) + " " + std::to_string(255 - b) + "\n";
  text += b64("ab") + " 256\n" + b64("cd") + " 257\n" + b64("abcd") + " 258\n";
  write_text(path, text);
  return path.string();
}

std::string save_hf(const Tokenizer& tok, const fs::path& path) {
  write_text(path, to_hf_tokenizer_json(tok));
  return path.string();
}

TEST(TokenizerFingerprint, SameTokenizerInEveryFileFormatSameFingerprint) {
  TempDir dir;
  const Tokenizer trained = Tokenizer::train(test::sample_documents(), 300);
  const Tokenizer tiktoken = Tokenizer::from_tiktoken(tiny_tiktoken(dir / "tiny.tiktoken"), "gpt2");
  for (const auto* tok : {&trained, &tiktoken}) {
    const std::string fp = tokenizer_fingerprint(*tok);
    ASSERT_EQ(fp.size(), 16u);
    EXPECT_EQ(fingerprint_string(fingerprint_bits(fp)), fp);
    tok->save((dir / "mt.json").string());
    EXPECT_EQ(tokenizer_fingerprint(Tokenizer::load((dir / "mt.json").string())), fp) << tok->kind();
    EXPECT_EQ(tokenizer_fingerprint(Tokenizer::load(save_hf(*tok, dir / "hf.json"))), fp) << tok->kind();
    // ... and again from the re-saved forms.
    Tokenizer::load((dir / "hf.json").string()).save((dir / "mt2.json").string());
    EXPECT_EQ(tokenizer_fingerprint(Tokenizer::load((dir / "mt2.json").string())), fp) << tok->kind();
  }
  // Loading the tiktoken file again, or by its pattern's regex, gives the same tokenizer.
  EXPECT_EQ(tokenizer_fingerprint(load_tokenizer((dir / "tiny.tiktoken").string(), "gpt2")),
            tokenizer_fingerprint(tiktoken));
}

TEST(TokenizerFingerprint, DifferentTokenizersDiffer) {
  TempDir dir;
  const auto docs = test::sample_documents();
  std::vector<std::string> other_docs;
  for (const auto& d : docs) other_docs.push_back("Zebras and quokkas " + d.substr(0, 40));
  const std::string tiny = tiny_tiktoken(dir / "tiny.tiktoken");
  const std::vector<std::string> fps = {
      tokenizer_fingerprint(Tokenizer::train(docs, 300)),
      tokenizer_fingerprint(Tokenizer::train(docs, 301)),        // one merge more
      tokenizer_fingerprint(Tokenizer::train(other_docs, 300)),  // same size, other merges
      tokenizer_fingerprint(Tokenizer::from_tiktoken(tiny, "gpt2")),
      tokenizer_fingerprint(Tokenizer::from_tiktoken(tiny, "cl100k")),  // only the pattern differs
  };
  for (size_t i = 0; i < fps.size(); ++i)
    for (size_t j = i + 1; j < fps.size(); ++j) EXPECT_NE(fps[i], fps[j]) << i << " vs " << j;
}

TEST(ShardHeader, FingerprintSitsInSlotsLlmcLeavesZero) {
  TempDir dir;
  const std::vector<int32_t> tokens = {5, 6, 7, 8};
  const std::string fp = "0123456789abcdef";
  write_shard((dir / "a.bin").string(), tokens, 0, fp);
  write_shard((dir / "b.bin").string(), tokens);
  std::vector<int32_t> header(256);
  std::ifstream((dir / "a.bin"), std::ios::binary).read(reinterpret_cast<char*>(header.data()), 1024);
  // What llm.c's dataloader checks: magic, version, count, file size.
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 4);
  EXPECT_EQ(fs::file_size(dir / "a.bin"), 1024u + 2 * tokens.size());
  EXPECT_EQ(header[3], kShardFingerprintTag);
  EXPECT_EQ(static_cast<uint32_t>(header[4]), 0x89abcdefu);
  EXPECT_EQ(static_cast<uint32_t>(header[5]), 0x01234567u);
  for (int i = 6; i < 256; ++i) EXPECT_EQ(header[i], 0) << i;
  EXPECT_EQ(ShardReader((dir / "a.bin").string()).tokenizer_fingerprint(), fp);
  EXPECT_EQ(ShardReader((dir / "b.bin").string()).tokenizer_fingerprint(), "");
  EXPECT_EQ(read_shard((dir / "a.bin").string()), tokens);
}

// prepare-data of a small corpus into out; words vary the tokenizer it learns.
void prepare(const fs::path& root, const std::string& out, const std::string& words) {
  fs::create_directories(root / ("corpus_" + out));
  std::string text;
  for (int i = 0; i < 40; ++i) text += words + " number " + std::to_string(i) + " of the corpus.\n\n";
  write_text(root / ("corpus_" + out) / "a.txt", text);
  PrepareOptions opt;
  opt.inputs = {(root / ("corpus_" + out)).string()};
  opt.output_dir = (root / out).string();
  opt.vocab_size = 300;
  opt.shard_tokens = 100000;
  opt.workers = 1;
  prepare_data(opt);
}

DatasetFiles dataset(const fs::path& dir) {
  DatasetFiles d{dir.string(), list_shards((dir / "train").string()), ShardFormat::kLlmc};
  for (const auto& f : list_shards((dir / "val").string())) d.files.push_back(f);
  return d;
}

TEST(DataTokenizer, PrepareDataMarksManifestAndShards) {
  TempDir dir;
  prepare(dir.path(), "a", "Apples and pears");
  const std::string fp = tokenizer_fingerprint(Tokenizer::load((dir / "a/tokenizer.json").string()));
  const auto manifest = nlohmann::json::parse(std::ifstream(dir / "a/manifest.json"));
  EXPECT_EQ(manifest.at("tokenizer_fingerprint"), fp);
  for (const auto& f : dataset(dir / "a").files) EXPECT_EQ(ShardReader(f).tokenizer_fingerprint(), fp) << f;
  const DataTokenizer dt = check_data_tokenizer({dataset(dir / "a")});
  EXPECT_EQ(dt.fingerprint, fp);
  EXPECT_EQ(dt.where, (dir / "a").string());
  EXPECT_TRUE(dt.notes.empty());
}

TEST(DataTokenizer, StrayShardOfAnotherTokenizerIsRefusedByName) {
  TempDir dir;
  prepare(dir.path(), "a", "Apples and pears");
  prepare(dir.path(), "b", "Quokkas, zebras");
  const std::string fa = dataset_fingerprint((dir / "a").string()), fb = dataset_fingerprint((dir / "b").string());
  ASSERT_NE(fa, fb);  // same vocabulary size, other merges
  fs::copy_file(dir / "b/train/train_000000.bin", dir / "a/train/train_000099.bin");
  std::string msg = error_of([&] { check_data_tokenizer({dataset(dir / "a")}); });
  EXPECT_TRUE(contains(msg, "train_000099.bin") && contains(msg, fa) && contains(msg, fb)) << msg;
  // A shard without any fingerprint (llm.c's, an older prepare-data's) among marked ones.
  fs::remove(dir / "a/train/train_000099.bin");
  write_shard((dir / "a/val/val_000077.bin").string(), std::vector<int32_t>(100, 3));
  msg = error_of([&] { check_data_tokenizer({dataset(dir / "a")}); });
  EXPECT_TRUE(contains(msg, "val_000077.bin") && contains(msg, "no tokenizer fingerprint")) << msg;
}

TEST(DataTokenizer, BlendOfTwoTokenizersIsRefusedNamingBoth) {
  TempDir dir;
  prepare(dir.path(), "a", "Apples and pears");
  prepare(dir.path(), "b", "Quokkas, zebras");
  prepare(dir.path(), "c", "Apples and pears");  // the same corpus learns the same tokenizer
  EXPECT_EQ(check_data_tokenizer({dataset(dir / "a"), dataset(dir / "c")}).fingerprint,
            dataset_fingerprint((dir / "a").string()));
  const std::string msg = error_of([&] { check_data_tokenizer({dataset(dir / "a"), dataset(dir / "b")}); });
  EXPECT_TRUE(contains(msg, (dir / "a").string()) && contains(msg, (dir / "b").string()) &&
              contains(msg, dataset_fingerprint((dir / "a").string())) &&
              contains(msg, dataset_fingerprint((dir / "b").string())))
      << msg;
}

TEST(DataTokenizer, ReplacedTokenizerFileIsRefused) {
  TempDir dir;
  prepare(dir.path(), "a", "Apples and pears");
  prepare(dir.path(), "b", "Quokkas, zebras");
  fs::copy_file(dir / "b/tokenizer.json", dir / "a/tokenizer.json", fs::copy_options::overwrite_existing);
  const std::string msg = error_of([&] { check_data_tokenizer({dataset(dir / "a")}); });
  EXPECT_TRUE(contains(msg, (dir / "a/tokenizer.json").string()) && contains(msg, "manifest.json")) << msg;
}

TEST(DataTokenizer, UnmarkedDataWorksWithANote) {
  TempDir dir;
  // llm.c-style data: shards without fingerprints, no manifest, no tokenizer.
  fs::create_directories(dir / "llmc/train");
  write_shard((dir / "llmc/train/t0.bin").string(), std::vector<int32_t>(100, 1));
  DataTokenizer dt = check_data_tokenizer({{(dir / "llmc").string(), {(dir / "llmc/train/t0.bin").string()}}});
  EXPECT_EQ(dt.fingerprint, "");
  ASSERT_EQ(dt.notes.size(), 1u);
  EXPECT_TRUE(contains(dt.notes[0], "cannot be checked")) << dt.notes[0];
  // Older prepare-data output: a tokenizer.json but unmarked shards -- checked by the tokenizer file.
  const Tokenizer tok = Tokenizer::train(test::sample_documents(), 300);
  tok.save((dir / "llmc/tokenizer.json").string());
  dt = check_data_tokenizer({{(dir / "llmc").string(), {(dir / "llmc/train/t0.bin").string()}}});
  EXPECT_EQ(dt.fingerprint, tokenizer_fingerprint(tok));
  ASSERT_EQ(dt.notes.size(), 1u);
  // ... where a marked shard of another tokenizer is still caught.
  write_shard((dir / "llmc/train/t1.bin").string(), std::vector<int32_t>(100, 1), 0, "00000000000000ff");
  const std::string msg = error_of([&] {
    check_data_tokenizer({{(dir / "llmc").string(), {(dir / "llmc/train/t0.bin").string(), (dir / "llmc/train/t1.bin").string()}}});
  });
  EXPECT_TRUE(contains(msg, "t1.bin") && contains(msg, "00000000000000ff")) << msg;
  // nanoGPT's headerless files read as before, with the note.
  write_text(dir / "train.bin", std::string(400, '\1'));
  dt = check_data_tokenizer({{dir.path().string(), {(dir / "train.bin").string()}, ShardFormat::kNanoGpt}});
  EXPECT_EQ(dt.fingerprint, "");
  EXPECT_EQ(dt.notes.size(), 1u);
}

TEST(DataLoader, ShardChangedUnderTheLoaderStopsIt) {
  TempDir dir;
  fs::create_directories(dir / "d");
  const std::vector<int32_t> ids(400, 7), other(400, 9);
  const std::string a = (dir / "d/a.bin").string(), b = (dir / "d/b.bin").string();
  write_shard(a, ids);
  write_shard(b, ids);
  DataLoader loader((dir / "d").string(), 8, 4, 0, 1, 100);
  DataLoader copy = loader;  // the prefetcher's copy checks as well
  loader.next();
  // Replaced by a new file of the same size (prepare-data renames its output in).
  write_shard(a, other);
  std::string msg = error_of([&] { loader.next(); });
  EXPECT_TRUE(contains(msg, a) && contains(msg, "changed on disk")) << msg;
  msg = error_of([&] { copy.next(); });
  EXPECT_TRUE(contains(msg, a) && contains(msg, "changed on disk")) << msg;
  // Rewritten in place: the same inode, a new modification time.
  DataLoader again((dir / "d").string(), 8, 4, 0, 1, 100);
  const auto t = fs::last_write_time(b);
  {
    std::fstream f(b, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024);
    f.write("\x09\x00", 2);
  }
  fs::last_write_time(b, t + std::chrono::seconds(1));
  again.restore(Cursor{0, 1, 0});
  msg = error_of([&] { again.next(); });
  EXPECT_TRUE(contains(msg, b) && contains(msg, "changed on disk")) << msg;
  // Removed.
  DataLoader third((dir / "d").string(), 8, 4, 0, 1, 100);
  fs::remove(a);
  msg = error_of([&] { third.next(); });
  EXPECT_TRUE(contains(msg, a) && contains(msg, "cannot be opened")) << msg;
}

// Issue 47: a shard rewritten in place with its size and modification time
// kept (cp -p, a restored backup, a tool that resets the time) passed the
// stat check; the block checksums taken at the first read catch it.
TEST(DataLoader, ShardRewrittenWithItsSizeAndTimeKeptStopsIt) {
  TempDir dir;
  fs::create_directories(dir / "d");
  std::vector<int32_t> ids(400);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 50);
  const std::string a = (dir / "d/a.bin").string();
  write_shard(a, ids);
  DataLoader loader((dir / "d").string(), 8, 4, 0, 1, 100);
  DataLoader copy = loader;  // the prefetcher's copy shares the checksums
  const Batch first = loader.next();
  EXPECT_EQ(first.inputs[0][1].item<int64_t>(), 1);
  const auto t = fs::last_write_time(a);
  {
    std::fstream f(a, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024 + 2 * 100);  // token 100, read by a later batch
    f.write("\x31\x00", 2);
  }
  fs::last_write_time(a, t);
  std::string msg = error_of([&] { loader.next(); });
  EXPECT_TRUE(contains(msg, a) && contains(msg, "changed on disk since training first read it") &&
              contains(msg, "size and modification time kept"))
      << msg;
  copy.restore(loader.cursor());
  msg = error_of([&] { copy.next(); });
  EXPECT_TRUE(contains(msg, "changed on disk since training first read it")) << msg;
  // Untouched data reads as before, the checksums taken at the first read.
  write_shard(a, ids);
  DataLoader fresh((dir / "d").string(), 8, 4, 0, 1, 100);
  for (int i = 0; i < 20; ++i) fresh.next();
}

TEST(DataLoader, PrepareDataOverARunningLoadersDataStopsIt) {
  TempDir dir;
  prepare(dir.path(), "a", "Apples and pears");
  DataLoader loader((dir / "a/train").string(), 8, 2, 0, 1, 300);
  loader.next();
  prepare(dir.path(), "a", "Quokkas, zebras");  // the user re-runs prepare-data with other text
  const std::string msg = error_of([&] { loader.next(); });
  EXPECT_TRUE(contains(msg, "train_000000.bin")) << msg;
}

}  // namespace
}  // namespace meshtrain
