// prepare-data on the inputs people have: one plain text file, JSON Lines,
// JSON arrays, gzip/zstd, folders with any text file names; every skipped
// file is reported with its reason; train/val split by documents, by seed,
// whatever the worker count.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "data_test_util.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {
namespace {

using test::error_of;
using test::TempDir;
using test::write_text;
namespace fs = std::filesystem;

std::vector<int32_t> read_folder(const fs::path& folder) {
  std::vector<int32_t> all;
  for (const auto& s : list_shards(folder.string())) {
    auto t = read_shard(s);
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

// The documents of a prepared split, decoded.
std::vector<std::string> documents(const fs::path& out, const std::string& split) {
  Tokenizer tok = Tokenizer::load((out / "tokenizer.json").string());
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int32_t t : read_folder(out / split)) {
    if (t == tok.eot()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(t);
    }
  }
  return docs;
}

std::string gzip(const std::string& data) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: gzip header
  std::string out(deflateBound(&z, data.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// A tiny-shakespeare-like play: speeches separated by blank lines.
std::string play(int speeches, const std::string& tag) {
  std::string text;
  for (int i = 0; i < speeches; ++i) {
    text += "CITIZEN " + tag + std::to_string(i) + ":\nWe are accounted poor citizens, the patricians good.\n";
    text += "What authority surfeits on would relieve us.\n\n";
  }
  return text;
}

PrepareOptions options(const TempDir& dir, std::vector<std::string> inputs) {
  PrepareOptions opt;
  opt.inputs = std::move(inputs);
  opt.output_dir = (dir / "out").string();
  opt.vocab_size = 300;
  opt.val_fraction = 0.1;
  opt.shard_tokens = 2000;
  opt.workers = 2;
  return opt;
}

TEST(PrepareInputs, OnePlainTextFileSplitsAtParagraphs) {
  TempDir dir;
  write_text(dir / "input.txt", play(50, ""));
  PrepareSummary s = prepare_data(options(dir, {(dir / "input.txt").string()}));
  EXPECT_EQ(s.train_documents + s.val_documents, 50);
  EXPECT_EQ(s.val_documents, 5);
  auto val = documents(dir / "out", "val");
  ASSERT_EQ(val.size(), 5u);
  EXPECT_EQ(val[0].rfind("CITIZEN ", 0), 0u) << val[0];
}

TEST(PrepareInputs, TextSplitLineAndFile) {
  TempDir dir;
  write_text(dir / "lines.txt", "one\ntwo\nthree\nfour\n");
  auto opt = options(dir, {(dir / "lines.txt").string()});
  opt.text_split = "line";
  opt.val_fraction = 0.25;
  auto s = prepare_data(opt);
  EXPECT_EQ(s.train_documents, 3);
  EXPECT_EQ(s.val_documents, 1);
  opt.text_split = "file";
  std::string msg = error_of([&] { prepare_data(opt); });
  EXPECT_NE(msg.find("need at least 2"), std::string::npos) << msg;
}

TEST(PrepareInputs, JsonlReadsTheTextFieldNotTheSyntax) {
  TempDir dir;
  std::string a, b;
  for (int i = 0; i < 40; ++i) a += nlohmann::json({{"id", i}, {"text", "alpha doc " + std::to_string(i)}}).dump() + "\n";
  for (int i = 0; i < 60; ++i) b += nlohmann::json({{"text", "beta doc \"quoted\"\n" + std::to_string(i)}}).dump() + "\n";
  write_text(dir / "a.jsonl", a);
  write_text(dir / "b.jsonl", b);
  PrepareSummary s = prepare_data(options(dir, {(dir / "a.jsonl").string(), (dir / "b.jsonl").string()}));
  EXPECT_EQ(s.train_documents + s.val_documents, 100);
  EXPECT_EQ(s.val_documents, 10);
  std::set<std::string> prefixes;
  for (const auto& d : documents(dir / "out", "train")) {
    EXPECT_EQ(d.find('{'), std::string::npos) << d;  // never the raw JSON
    prefixes.insert(d.substr(0, 4));
  }
  EXPECT_EQ(prefixes, (std::set<std::string>{"alph", "beta"}));
  // Validation takes documents of both files, not one whole file.
  std::set<std::string> val_prefixes;
  for (const auto& d : documents(dir / "out", "val")) val_prefixes.insert(d.substr(0, 4));
  EXPECT_EQ(val_prefixes.size(), 2u);
}

TEST(PrepareInputs, TextKeyJsonArrayAndBadRecordsAreNamed) {
  TempDir dir;
  nlohmann::json arr = nlohmann::json::array();
  for (int i = 0; i < 20; ++i) arr.push_back({{"content", "array doc " + std::to_string(i)}});
  write_text(dir / "docs.json", arr.dump());
  auto opt = options(dir, {(dir / "docs.json").string()});
  std::string msg = error_of([&] { prepare_data(opt); });
  EXPECT_NE(msg.find("docs.json [0]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--text-key"), std::string::npos) << msg;
  EXPECT_NE(msg.find("content"), std::string::npos) << msg;  // lists the keys it has
  opt.text_key = "content";
  EXPECT_EQ(prepare_data(opt).train_documents, 18);

  write_text(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\nnot json at all\n");
  msg = error_of([&] { prepare_data(options(dir, {(dir / "bad.jsonl").string()})); });
  EXPECT_NE(msg.find("bad.jsonl:3"), std::string::npos) << msg;
  write_text(dir / "num.jsonl", "{\"text\": 5}\n");
  msg = error_of([&] { prepare_data(options(dir, {(dir / "num.jsonl").string()})); });
  EXPECT_NE(msg.find("num.jsonl:1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a string"), std::string::npos) << msg;
}

TEST(PrepareInputs, GzipAndZstdDecompressed) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 30; ++i) jsonl += nlohmann::json({{"text", "compressed doc " + std::to_string(i)}}).dump() + "\n";
  // The inputs in a folder of their own: an --output inside an --input is refused.
  fs::create_directories(dir / "in");
  write_text(dir / "in/a.jsonl.gz", gzip(jsonl));
  write_text(dir / "in/b.txt.zst", zstd(play(30, "z")));
  // Two gzip members back to back (pigz, cat a.gz b.gz) are one stream.
  write_text(dir / "in/c.txt.gz", gzip(play(5, "c1")) + gzip(play(5, "c2")));
  PrepareSummary s = prepare_data(options(dir, {(dir / "in").string()}));
  EXPECT_EQ(s.files, 3);
  EXPECT_EQ(s.train_documents + s.val_documents, 70);
  auto all = documents(dir / "out", "train");
  auto val = documents(dir / "out", "val");
  all.insert(all.end(), val.begin(), val.end());
  std::set<std::string> docs(all.begin(), all.end());
  EXPECT_TRUE(docs.count("compressed doc 7"));
  EXPECT_TRUE(docs.count(play(1, "c2").substr(0, play(1, "c2").size() - 1)));  // paragraph without its blank line
  write_text(dir / "broken.txt.gz", gzip(play(30, "x")).substr(0, 40));
  std::string msg = error_of([&] { prepare_data(options(dir, {(dir / "broken.txt.gz").string()})); });
  EXPECT_NE(msg.find("broken.txt.gz"), std::string::npos) << msg;
}

TEST(PrepareInputs, FolderUsesEveryTextFileAndNamesEverySkip) {
  TempDir dir;
  fs::create_directories(dir / "corpus/deep/er");
  fs::create_directories(dir / "corpus/.git");
  write_text(dir / "corpus/notes.md", play(10, "md"));
  write_text(dir / "corpus/README", play(10, "readme"));
  write_text(dir / "corpus/deep/er/chapter.rst", play(10, "rst"));
  write_text(dir / "corpus/.git/config", "[core]\n");
  write_text(dir / "corpus/table.csv", "a,b\n1,2\n");
  write_text(dir / "corpus/weights.bin", std::string("\0\1\2", 3));
  write_text(dir / "corpus/old.txt.bz2", "BZh9");
  write_text(dir / "corpus/empty.txt", "\n\n");
  write_text(dir / "corpus/.hidden.txt", "x");
  PrepareSummary s = prepare_data(options(dir, {(dir / "corpus").string()}));
  EXPECT_EQ(s.files, 3);
  EXPECT_EQ(s.train_documents + s.val_documents, 30);
  std::map<std::string, std::string> reasons;
  for (const auto& [f, why] : s.skipped) reasons[fs::path(f).filename().string()] = why;
  for (std::string f : {"table.csv", "weights.bin", "old.txt.bz2", "empty.txt", ".hidden.txt"}) {
    EXPECT_TRUE(reasons.count(f)) << f << " not reported";
    EXPECT_FALSE(reasons[f].empty()) << f;
  }
  EXPECT_FALSE(reasons.count("config")) << "hidden folders are not corpus";
  auto manifest = nlohmann::json::parse(std::ifstream(dir / "out/manifest.json"));
  EXPECT_EQ(manifest["skipped"].size(), s.skipped.size());
  EXPECT_EQ(manifest["files"].size(), 3u);
  // Nothing usable: the error lists each file and why.
  std::string msg = error_of([&] { prepare_data(options(dir, {(dir / "corpus/table.csv").string()})); });
  EXPECT_NE(msg.find("table.csv"), std::string::npos) << msg;
  EXPECT_NE(msg.find("JSONL"), std::string::npos) << msg;
}

// Issue 47: a link loop in an input folder aborted with a raw filesystem
// error; --workers 5000 started 5,000 threads.
TEST(PrepareInputs, LinkLoopsAreSkippedAndWorkersBounded) {
  TempDir dir;
  fs::create_directories(dir / "corpus/sub");
  write_text(dir / "corpus/play.txt", play(20, "p"));
  fs::create_symlink("loop_b", dir / "corpus/loop_a");
  fs::create_symlink("loop_a", dir / "corpus/loop_b");
  fs::create_symlink("self", dir / "corpus/sub/self");
  fs::create_symlink("nowhere", dir / "corpus/broken");
  fs::create_directory_symlink("..", dir / "corpus/sub/up");  // a linked folder that leads back: not entered
  PrepareSummary s = prepare_data(options(dir, {(dir / "corpus").string()}));
  EXPECT_EQ(s.files, 1);
  std::map<std::string, std::string> reasons;
  for (const auto& [f, why] : s.skipped) reasons[fs::path(f).filename().string()] = why;
  for (std::string f : {"loop_a", "loop_b", "self"})
    EXPECT_NE(reasons[f].find("a symbolic link loop"), std::string::npos) << f << ": " << reasons[f];
  EXPECT_NE(reasons["broken"].find("a broken link"), std::string::npos) << reasons["broken"];
  // Named directly, a loop is refused naming it.
  std::string msg = error_of([&] { prepare_data(options(dir, {(dir / "corpus/loop_a").string()})); });
  EXPECT_NE(msg.find("loop_a' cannot be read"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("filesystem error"), std::string::npos) << msg;

  auto opt = options(dir, {(dir / "corpus/play.txt").string()});
  opt.output_dir = (dir / "many").string();
  opt.workers = 5000;
  msg = error_of([&] { prepare_data(opt); });
  EXPECT_NE(msg.find("--workers 5000 is more than 4 per core"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "many"));
}

TEST(PrepareInputs, SplitIsReproducibleAndIndependentOfWorkers) {
  TempDir dir;
  write_text(dir / "input.txt", play(400, "w"));
  auto opt = options(dir, {(dir / "input.txt").string()});
  opt.shard_tokens = 700;
  opt.workers = 1;
  prepare_data(opt);
  auto train1 = read_folder(dir / "out/train"), val1 = read_folder(dir / "out/val");
  auto shards1 = list_shards((dir / "out/train").string()).size();
  opt.workers = 3;
  prepare_data(opt);
  EXPECT_EQ(read_folder(dir / "out/train"), train1);
  EXPECT_EQ(read_folder(dir / "out/val"), val1);
  EXPECT_EQ(list_shards((dir / "out/train").string()).size(), shards1);
  // Fixed-size shards: all but the last hold exactly shard_tokens; the last at least half.
  auto shards = list_shards((dir / "out/train").string());
  ASSERT_GT(shards.size(), 2u);
  for (size_t i = 0; i + 1 < shards.size(); ++i) EXPECT_EQ(ShardReader(shards[i]).size(), 700) << shards[i];
  EXPECT_GE(ShardReader(shards.back()).size(), 350);
  opt.seed = 9;
  prepare_data(opt);
  EXPECT_NE(read_folder(dir / "out/val"), val1);
}

// Parquet through Arrow/Parquet C++ from the pyarrow wheel in .deps/venv
// (scripts/setup.sh); the same venv's pyarrow writes the test file.
TEST(PrepareInputs, ParquetTextColumn) {
  TempDir dir;
  const std::string py = std::string(MT_SOURCE_DIR) + "/.deps/venv/bin/python";
  const std::string script =
      "import sys, pyarrow as pa, pyarrow.parquet as pq\n"
      "t = pa.table({'id': list(range(50)), 'body': [f'parquet doc {i}' for i in range(50)]})\n"
      "pq.write_table(t, sys.argv[1], row_group_size=16)\n";
  write_text(dir / "make.py", script);
  const std::string cmd = py + " " + (dir / "make.py").string() + " " + (dir / "docs.parquet").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "cannot write a Parquet file with " << py
                                          << " (scripts/setup.sh installs pyarrow there)";
  auto opt = options(dir, {(dir / "docs.parquet").string()});
  std::string msg = error_of([&] { prepare_data(opt); });
  EXPECT_NE(msg.find("docs.parquet"), std::string::npos) << msg;
#ifndef MESHTRAIN_HAVE_PARQUET
  // A build without pyarrow's Arrow/Parquet C++ (e.g. against a GPU
  // machine's torch) refuses the file, saying why, and reads nothing.
  EXPECT_NE(msg.find("Parquet support is not built in"), std::string::npos) << msg;
  GTEST_SKIP() << "Parquet support is not built in (no pyarrow beside torch or in .deps/venv at configure "
                  "time): checked that .parquet inputs are refused with that reason";
#endif
  EXPECT_NE(msg.find("body"), std::string::npos) << msg;  // names the columns it has
  opt.text_key = "body";
  PrepareSummary s = prepare_data(opt);
  EXPECT_EQ(s.train_documents + s.val_documents, 50) << "Parquet support missing? skipped: "
                                                     << (s.skipped.empty() ? "" : s.skipped[0].second);
  auto val = documents(dir / "out", "val");
  ASSERT_EQ(val.size(), 5u);
  EXPECT_EQ(val[0].rfind("parquet doc ", 0), 0u);
  write_text(dir / "fake.parquet", "PAR1 not really");
  msg = error_of([&] { prepare_data(options(dir, {(dir / "fake.parquet").string()})); });
  EXPECT_NE(msg.find("fake.parquet"), std::string::npos) << msg;
}

TEST(PrepareInputs, TiktokenVocabularyNeedsPatternWhenUnknown) {
  TempDir dir;
  write_text(dir / "input.txt", play(10, ""));
  write_text(dir / "v.tiktoken", "YQ== 0\n");
  auto opt = options(dir, {(dir / "input.txt").string()});
  opt.vocab_size = 0;
  opt.tokenizer_file = (dir / "v.tiktoken").string();
  std::string msg = error_of([&] { prepare_data(opt); });
  EXPECT_NE(msg.find("--pattern"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

}  // namespace
}  // namespace meshtrain
