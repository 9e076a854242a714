// data/: token shards, the loader, prepare-data (the tokenizer: tokenizer_test).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <set>

#include "data_test_util.h"
#include "meshtrain/core/check.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace meshtrain;
using namespace meshtrain::test;

// ---------------------------------------------------------------- shards

TEST(Shards, WriteReadVersions) {
  TempDir dir;
  std::vector<int32_t> small = {0, 1, 2, 65535, 7};
  std::vector<int32_t> big = {0, 65536, 100000, 3};
  write_shard((dir / "a.bin").string(), small);       // auto -> 1
  write_shard((dir / "b.bin").string(), big);         // auto -> 7 (uint32)
  write_shard((dir / "c.bin").string(), small, 7);
  // meshtrain's old uint32 files (magic 20240520, version 2) still read.
  {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 2;
    header[2] = static_cast<int32_t>(big.size());
    std::ofstream out(dir / "legacy.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(big.data()), static_cast<std::streamsize>(4 * big.size()));
  }
  EXPECT_EQ(read_shard((dir / "legacy.bin").string()), big);
  EXPECT_NE(error_of([&] { write_shard((dir / "e.bin").string(), small, 2); }).find("version"), std::string::npos);
  EXPECT_EQ(fs::file_size(dir / "a.bin"), 1024u + 2 * small.size());
  EXPECT_EQ(fs::file_size(dir / "b.bin"), 1024u + 4 * big.size());
  EXPECT_EQ(read_shard((dir / "a.bin").string()), small);
  EXPECT_EQ(read_shard((dir / "b.bin").string()), big);
  EXPECT_EQ(read_shard((dir / "c.bin").string()), small);
  ShardReader r((dir / "b.bin").string());
  EXPECT_EQ(r.size(), 4);
  EXPECT_EQ(r.read(1, 2), (std::vector<int32_t>{65536, 100000}));
  EXPECT_FALSE(fs::exists(dir / "a.bin.tmp"));
  EXPECT_NE(error_of([&] { write_shard((dir / "d.bin").string(), big, 1); }).find("d.bin"), std::string::npos);
  // Header as llm.c writes it.
  std::ifstream in(dir / "a.bin", std::ios::binary);
  int32_t header[3];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 5);
  // uint32 as llm.c's Llama-3 writer: magic 20240801, version 7.
  std::ifstream in32(dir / "b.bin", std::ios::binary);
  in32.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 4);
}

TEST(Shards, ReadsNanoGptRawUint16) {
  TempDir dir;
  std::vector<uint16_t> raw = {3, 1, 4, 1, 5, 65535};
  {
    std::ofstream out(dir / "train.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(raw.data()), static_cast<std::streamsize>(2 * raw.size()));
  }
  EXPECT_EQ(read_shard((dir / "train.bin").string(), 0, ShardFormat::kNanoGpt),
            (std::vector<int32_t>{3, 1, 4, 1, 5, 65535}));
  // Without the explicit format the missing header is named.
  std::string msg = error_of([&] { read_shard((dir / "train.bin").string()); });
  EXPECT_NE(msg.find("nanogpt"), std::string::npos) << msg;
  write_text(dir / "odd.bin", "abc");
  msg = error_of([&] { read_shard((dir / "odd.bin").string(), 0, ShardFormat::kNanoGpt); });
  EXPECT_NE(msg.find("odd.bin"), std::string::npos) << msg;
}

namespace {
template <class T>
void write_npy(const fs::path& path, const std::string& descr, const std::vector<T>& values,
               const std::string& shape_tail = ",") {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" +
                     std::to_string(values.size()) + shape_tail + "), }";
  // numpy pads the header with spaces and a newline to a multiple of 64 bytes.
  size_t total = 10 + dict.size() + 1;
  dict += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(dict.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << dict;
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
}
}  // namespace

TEST(Shards, ReadsNpy) {
  TempDir dir;
  write_npy<uint16_t>(dir / "u2.npy", "<u2", {5, 6, 65535});
  write_npy<int32_t>(dir / "i4.npy", "<i4", {1, 2, 3, 4});
  write_npy<uint32_t>(dir / "u4.npy", "<u4", {70000});
  write_npy<int64_t>(dir / "i8.npy", "<i8", {9, 8});
  write_npy<float>(dir / "f4.npy", "<f4", {1.0f});
  write_npy<uint8_t>(dir / "u1.npy", "|u1", {0, 200});
  write_npy<int16_t>(dir / "i2.npy", "<i2", {300, 7});
  write_npy<uint64_t>(dir / "u8.npy", "<u8", {123456});
  write_npy<int32_t>(dir / "col.npy", "<i4", {4, 5, 6}, ", 1");
  write_npy<int32_t>(dir / "mat.npy", "<i4", {4, 5, 6, 7}, ", 2");
  write_npy<uint16_t>(dir / "be.npy", ">u2", {1});
  EXPECT_EQ(read_shard((dir / "u1.npy").string()), (std::vector<int32_t>{0, 200}));
  EXPECT_EQ(read_shard((dir / "i2.npy").string()), (std::vector<int32_t>{300, 7}));
  EXPECT_EQ(read_shard((dir / "u8.npy").string()), (std::vector<int32_t>{123456}));
  EXPECT_EQ(read_shard((dir / "col.npy").string()), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_NE(error_of([&] { read_shard((dir / "mat.npy").string()); }).find("(N,) or (N, 1)"), std::string::npos);
  EXPECT_NE(error_of([&] { read_shard((dir / "be.npy").string()); }).find(">u2"), std::string::npos);
  EXPECT_EQ(read_shard((dir / "u2.npy").string()), (std::vector<int32_t>{5, 6, 65535}));
  EXPECT_EQ(read_shard((dir / "i4.npy").string()), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(read_shard((dir / "u4.npy").string()), (std::vector<int32_t>{70000}));
  EXPECT_EQ(read_shard((dir / "i8.npy").string()), (std::vector<int32_t>{9, 8}));
  std::string msg = error_of([&] { read_shard((dir / "f4.npy").string()); });
  EXPECT_NE(msg.find("f4.npy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<f4"), std::string::npos) << msg;
  write_npy<int32_t>(dir / "neg.npy", "<i4", {1, -1});
  EXPECT_NE(error_of([&] { read_shard((dir / "neg.npy").string()); }).find("neg.npy"), std::string::npos);
}

TEST(Shards, CorruptShardsAreRefusedByName) {
  TempDir dir;
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  write_shard((dir / "good.bin").string(), tokens);

  fs::copy_file(dir / "good.bin", dir / "badmagic.bin");
  {
    std::fstream f(dir / "badmagic.bin", std::ios::binary | std::ios::in | std::ios::out);
    int32_t wrong = 12345;
    f.write(reinterpret_cast<const char*>(&wrong), 4);
  }
  fs::copy_file(dir / "good.bin", dir / "truncated.bin");
  fs::resize_file(dir / "truncated.bin", fs::file_size(dir / "good.bin") - 3);
  write_text(dir / "tiny.bin", "short");
  fs::copy_file(dir / "good.bin", dir / "badversion.bin");
  {
    std::fstream f(dir / "badversion.bin", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(4);
    int32_t v = 7;
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  struct Case {
    std::string file, what;
  };
  for (const Case& c : {Case{"badmagic.bin", "magic"}, Case{"truncated.bin", "truncated"},
                        Case{"tiny.bin", "truncated"}, Case{"badversion.bin", "version"}}) {
    std::string msg = error_of([&] { read_shard((dir / c.file).string()); });
    EXPECT_NE(msg.find(c.file), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
  }
  std::string msg = error_of([&] { read_shard((dir / "good.bin").string(), 5); });
  EXPECT_NE(msg.find("good.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocabulary"), std::string::npos) << msg;
  EXPECT_EQ(read_shard((dir / "good.bin").string(), 7), tokens);
}

TEST(Shards, ListShards) {
  TempDir dir;
  fs::create_directories(dir / "s");
  write_shard((dir / "s/b_000001.bin").string(), {1});
  write_shard((dir / "s/b_000000.bin").string(), {1});
  write_npy<int32_t>(dir / "s/c.npy", "<i4", {1});
  write_text(dir / "s/notes.txt", "not a shard");
  auto shards = list_shards((dir / "s").string());
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(fs::path(shards[0]).filename(), "b_000000.bin");
  EXPECT_EQ(fs::path(shards[1]).filename(), "b_000001.bin");
  EXPECT_EQ(fs::path(shards[2]).filename(), "c.npy");
  fs::create_directories(dir / "empty");
  EXPECT_NE(error_of([&] { list_shards((dir / "empty").string()); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] { list_shards((dir / "nowhere").string()); }).find("nowhere"), std::string::npos);
}

// ---------------------------------------------------------------- loader

namespace {
// Shards whose token at stream offset k is (k + first) % 1000, so a batch's
// contents tell where it came from.
void write_counting_shards(const fs::path& folder, const std::vector<int64_t>& sizes) {
  fs::create_directories(folder);
  int64_t k = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < sizes[s]; ++i) tokens.push_back(static_cast<int32_t>((k++) % 1000));
    char name[32];
    std::snprintf(name, sizeof(name), "train_%06zu.bin", s);
    write_shard((folder / name).string(), tokens);
  }
}
}  // namespace

TEST(DataLoader, BatchFollowsTheStreamFormula) {
  TempDir dir;
  write_counting_shards(dir / "d", {100});
  DataLoader loader((dir / "d").string(), /*T=*/4, /*global_batch=*/3, 0, 1, 1000);
  for (int step = 0; step < 2; ++step) {
    Batch b = loader.next();
    ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(b.inputs.scalar_type(), torch::kInt64);
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t t = 0; t < 4; ++t) {
        EXPECT_EQ(b.inputs[i][t].item<int64_t>(), step * 12 + i * 4 + t);
        EXPECT_EQ(b.targets[i][t].item<int64_t>(), step * 12 + i * 4 + t + 1);
      }
    }
  }
  EXPECT_EQ(loader.cursor(), (Cursor{0, 0, 24}));
}

TEST(DataLoader, DpSlicesConcatenateToTheGlobalBatch) {
  TempDir dir;
  write_counting_shards(dir / "d", {150, 90});
  DataLoader whole((dir / "d").string(), 5, 4, 0, 1, 1000);
  DataLoader half0((dir / "d").string(), 5, 4, 0, 2, 1000);
  DataLoader half1((dir / "d").string(), 5, 4, 1, 2, 1000);
  for (int step = 0; step < 12; ++step) {
    Batch w = whole.next(), a = half0.next(), b = half1.next();
    ASSERT_EQ(a.inputs.size(0), 2);
    EXPECT_TRUE(torch::equal(torch::cat({a.inputs, b.inputs}), w.inputs)) << step;
    EXPECT_TRUE(torch::equal(torch::cat({a.targets, b.targets}), w.targets)) << step;
    EXPECT_EQ(whole.cursor(), half1.cursor());
  }
}

TEST(DataLoader, CursorRestoreReplaysTheSameBatches) {
  TempDir dir;
  write_counting_shards(dir / "d", {70, 50, 60});
  DataLoader a((dir / "d").string(), 4, 2, 0, 1, 1000);
  for (int i = 0; i < 11; ++i) a.next();
  nlohmann::json saved = a.cursor();
  std::vector<Batch> expected;
  for (int i = 0; i < 15; ++i) expected.push_back(a.next());

  DataLoader b((dir / "d").string(), 4, 2, 0, 1, 1000);
  b.restore(saved.get<Cursor>());
  for (int i = 0; i < 15; ++i) {
    Batch got = b.next();
    EXPECT_TRUE(torch::equal(got.inputs, expected[i].inputs)) << i;
    EXPECT_TRUE(torch::equal(got.targets, expected[i].targets)) << i;
  }
  EXPECT_EQ(saved.dump(), nlohmann::json(Cursor{saved["epoch"], saved["shard"], saved["position"]}).dump());
  EXPECT_NE(error_of([&] { b.restore(Cursor{0, 3, 0}); }).find("shard"), std::string::npos);
  EXPECT_NE(error_of([&] { b.restore(Cursor{0, 0, 71}); }).find("train_000000.bin"), std::string::npos);
}

TEST(DataLoader, WrapsAcrossShardsAndEpochs) {
  TempDir dir;
  // batch needs 2*4+1 = 9 tokens; shard 0 gives 2 batches (offsets 0, 8; 16+9 > 20).
  write_counting_shards(dir / "d", {20, 10});
  DataLoader loader((dir / "d").string(), 4, 2, 0, 1, 1000);
  std::vector<int64_t> firsts;
  std::vector<Cursor> cursors;
  for (int i = 0; i < 7; ++i) {
    firsts.push_back(loader.next().inputs[0][0].item<int64_t>());
    cursors.push_back(loader.cursor());
  }
  // Shard 0: 0, 8; shard 1 starts at stream offset 20: 20; then epoch 1.
  EXPECT_EQ(firsts, (std::vector<int64_t>{0, 8, 20, 0, 8, 20, 0}));
  EXPECT_EQ(cursors[2], (Cursor{0, 1, 8}));
  EXPECT_EQ(cursors[3], (Cursor{1, 0, 8}));
  EXPECT_EQ(cursors[6], (Cursor{2, 0, 8}));
}

TEST(DataLoader, ReadsNanoGptTrainBin) {
  TempDir dir;
  std::vector<uint16_t> raw(100);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint16_t>(i);
  {
    std::ofstream out(dir / "train.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(raw.data()), static_cast<std::streamsize>(2 * raw.size()));
  }
  DataLoader loader({(dir / "train.bin").string()}, ShardFormat::kNanoGpt, 4, 3, 0, 1, 1000);
  EXPECT_EQ(loader.total_tokens(), 100);
  Batch b = loader.next();
  EXPECT_EQ(b.inputs[1][0].item<int64_t>(), 4);
  EXPECT_EQ(b.targets[2][3].item<int64_t>(), 12);
}

TEST(DataLoader, TooSmallDataIsExplained) {
  TempDir dir;
  write_counting_shards(dir / "small", {10, 12});
  std::string msg = error_of([&] { DataLoader((dir / "small").string(), 8, 2, 0, 1, 1000); });
  EXPECT_NE(msg.find("too small"), std::string::npos) << msg;
  write_counting_shards(dir / "mixed", {100, 12});
  msg = error_of([&] { DataLoader((dir / "mixed").string(), 8, 2, 0, 1, 1000); });
  EXPECT_NE(msg.find("train_000001.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("17"), std::string::npos) << msg;
  msg = error_of([&] { DataLoader((dir / "mixed").string(), 8, 3, 0, 2, 1000); });
  EXPECT_NE(msg.find("divisible"), std::string::npos) << msg;
  // Token ids are checked against the vocabulary as they are read.
  write_counting_shards(dir / "ids", {100});
  DataLoader loader((dir / "ids").string(), 8, 2, 0, 1, 10);
  msg = error_of([&] { loader.next(); });
  EXPECT_NE(msg.find("train_000000.bin"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- prepare-data

namespace {
std::vector<int32_t> read_folder(const fs::path& folder) {
  std::vector<int32_t> all;
  for (const auto& s : list_shards(folder.string())) {
    auto t = read_shard(s);
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

std::vector<std::string> decode_documents(const Tokenizer& tok, const std::vector<int32_t>& tokens) {
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int32_t t : tokens) {
    if (t == tok.eot()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(t);
    }
  }
  EXPECT_TRUE(cur.empty()) << "stream must end with end-of-text";
  return docs;
}
}  // namespace

TEST(PrepareData, TinyFortuneCorpus) {
  TempDir dir;
  fs::create_directories(dir / "corpus/sub");
  std::string a, b;
  std::set<std::string> originals;
  for (int i = 0; i < 30; ++i) {
    std::string doc = "Fortune number " + std::to_string(i) + ": the early bird gets the worm.\n";
    a += doc + "%\n";
    originals.insert(doc);
    std::string doc2 = "Caf\xc3\xa9 wisdom " + std::to_string(i) + "\n  -- \xe5\xad\x94\xe5\xad\x90\n";
    b += doc2 + "%\n";
    originals.insert(doc2);
  }
  write_text(dir / "corpus/wisdom", a);
  write_text(dir / "corpus/sub/cafe", b);
  // The literal is 16 bytes of data (it holds NULs, so its length is given).
  constexpr char kIndex[] = "\0\0\0\2binary index";
  write_text(dir / "corpus/wisdom.dat", std::string(kIndex, sizeof kIndex - 1));
  write_text(dir / "corpus/blob", std::string("\x7f" "ELF\0\0\0", 7));
  fs::create_symlink("wisdom", dir / "corpus/wisdom.u8");

  PrepareOptions opt;
  opt.inputs = {(dir / "corpus").string()};
  opt.output_dir = (dir / "out").string() + "/";  // a trailing slash names the same folder
  opt.vocab_size = 300;
  opt.val_fraction = 0.1;
  opt.shard_tokens = 500;
  opt.seed = 3;
  PrepareSummary s = prepare_data(opt);
  EXPECT_EQ(s.train_documents + s.val_documents, 60);
  EXPECT_EQ(s.val_documents, 6);
  // wisdom.dat (index), blob (binary), wisdom.u8 (link to wisdom): each named with its reason.
  ASSERT_EQ(s.skipped.size(), 3u);
  std::map<std::string, std::string> reasons;
  for (const auto& [f, why] : s.skipped) reasons[fs::path(f).filename().string()] = why;
  EXPECT_NE(reasons["wisdom.dat"].find("index"), std::string::npos);
  EXPECT_NE(reasons["blob"].find("binary"), std::string::npos);
  EXPECT_NE(reasons["wisdom.u8"].find("duplicate"), std::string::npos);
  EXPECT_EQ(s.files, 2);
  EXPECT_FALSE(to_string(s).empty());

  Tokenizer tok = Tokenizer::load((dir / "out/tokenizer.json").string());
  EXPECT_EQ(tok.vocab_size(), 300);
  auto train = read_folder(dir / "out/train");
  auto val = read_folder(dir / "out/val");
  EXPECT_EQ(static_cast<int64_t>(train.size()), s.train_tokens);
  EXPECT_GT(list_shards((dir / "out/train").string()).size(), 1u);  // 500-token shards
  EXPECT_TRUE(fs::exists(dir / "out/val/val_000000.bin"));
  auto train_docs = decode_documents(tok, train), val_docs = decode_documents(tok, val);
  EXPECT_EQ(train_docs.size(), 54u);
  EXPECT_EQ(val_docs.size(), 6u);
  std::set<std::string> seen(train_docs.begin(), train_docs.end());
  seen.insert(val_docs.begin(), val_docs.end());
  EXPECT_EQ(seen, originals);  // every document exactly once, decoded back

  auto manifest = nlohmann::json::parse(std::ifstream(dir / "out/manifest.json"));
  EXPECT_EQ(manifest["vocab_size"], 300);
  EXPECT_EQ(manifest["val"]["documents"], 6);
  EXPECT_EQ(manifest["train"]["tokens"], s.train_tokens);

  // Same seed, same output; rerunning replaces the earlier output.
  auto first_train = train;
  prepare_data(opt);
  EXPECT_EQ(read_folder(dir / "out/train"), first_train);
  opt.seed = 4;
  prepare_data(opt);
  EXPECT_NE(read_folder(dir / "out/train"), first_train);
}

TEST(PrepareData, BadOptionsLeaveNothingBehind) {
  TempDir dir;
  write_text(dir / "one", "first\n%\nsecond\n%\nthird\n");
  PrepareOptions opt;
  opt.inputs = {(dir / "one").string()};
  opt.output_dir = (dir / "out").string();
  EXPECT_NE(error_of([&] { prepare_data(opt); }).find("exactly one"), std::string::npos);
  opt.vocab_size = 280;
  opt.tokenizer_file = (dir / "x.tiktoken").string();
  EXPECT_NE(error_of([&] { prepare_data(opt); }).find("exactly one"), std::string::npos);
  opt.vocab_size = 0;  // the tiktoken file does not exist
  EXPECT_NE(error_of([&] { prepare_data(opt); }).find("x.tiktoken"), std::string::npos);
  opt.inputs = {(dir / "nope").string()};
  EXPECT_NE(error_of([&] { prepare_data(opt); }).find("nope"), std::string::npos);
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename(), "one") << "left behind: " << e.path();
  }
  // A folder that is not ours is never replaced.
  fs::create_directories(dir / "mine");
  write_text(dir / "mine/precious.txt", "keep me");
  opt = PrepareOptions{};
  opt.inputs = {(dir / "one").string()};
  opt.output_dir = (dir / "mine").string();
  opt.vocab_size = 260;
  EXPECT_NE(error_of([&] { prepare_data(opt); }).find("mine"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "mine/precious.txt"));
}

// The project corpus, timed (a few seconds; run with
// --gtest_also_run_disabled_tests --gtest_filter='*Fortunes*').
TEST(PrepareData, DISABLED_FortunesCorpus) {
  const std::string corpus = "/usr/share/games/fortunes";
  if (!fs::exists(corpus)) GTEST_SKIP() << corpus << " is not installed";
  for (int64_t vocab : {512, 4096}) {
    TempDir dir;
    PrepareOptions opt;
    opt.inputs = {corpus};
    opt.output_dir = (dir / "fortunes").string();
    opt.vocab_size = vocab;
    PrepareSummary s = prepare_data(opt);
    std::cout << to_string(s) << "\n";
    EXPECT_EQ(s.vocab_size, vocab);
    if (vocab == 512) EXPECT_LT(s.seconds, 20.0);
    Tokenizer tok = Tokenizer::load((dir / "fortunes/tokenizer.json").string());
    auto val_docs = decode_documents(tok, read_folder(dir / "fortunes/val"));
    EXPECT_EQ(static_cast<int64_t>(val_docs.size()), s.val_documents);
  }
}
