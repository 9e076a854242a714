// Blended datasets (data_config.datasets): sequences drawn in proportion to
// the weights, the same global batch on any dp, exact resume from the cursor.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/shards.h"

namespace meshtrain {
namespace {

using test::error_of;
using test::TempDir;
namespace fs = std::filesystem;

// Dataset d's tokens are d*10000 + 0, 1, 2, ... so every sequence names its source.
DataSource counting_source(const fs::path& folder, int d, std::vector<int64_t> sizes, double weight) {
  fs::create_directories(folder);
  DataSource src;
  src.weight = weight;
  int32_t k = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < sizes[s]; ++i) tokens.push_back(d * 10000 + (k++));
    src.files.push_back((folder / ("train_" + std::to_string(s) + ".bin")).string());
    write_shard(src.files.back(), tokens);
  }
  return src;
}

std::vector<DataSource> three_sources(const TempDir& dir) {
  return {counting_source(dir / "a", 0, {300, 200}, 5.0), counting_source(dir / "b", 1, {120}, 3.0),
          counting_source(dir / "c", 2, {90, 90}, 2.0)};
}

TEST(Blend, SequencesFollowTheWeights) {
  TempDir dir;
  DataLoader loader(three_sources(dir), /*T=*/8, /*global_batch=*/10, 0, 1, 40000);
  std::array<int, 3> counts{};
  for (int step = 0; step < 20; ++step) {
    Batch b = loader.next();
    ASSERT_EQ(b.inputs.size(0), 10);
    for (int64_t i = 0; i < 10; ++i) {
      int64_t first = b.inputs[i][0].item<int64_t>();
      int d = static_cast<int>(first / 10000);
      ++counts[static_cast<size_t>(d)];
      // A sequence is contiguous within its dataset and targets are shifted inputs.
      for (int64_t t = 0; t < 8; ++t) EXPECT_EQ(b.inputs[i][t].item<int64_t>() / 10000, d);
      EXPECT_TRUE(torch::equal(b.inputs[i].slice(0, 1), b.targets[i].slice(0, 0, 7)));
    }
    // Megatron's greedy schedule: after n samples each dataset is within one of w*n.
    int n = (step + 1) * 10;
    EXPECT_NEAR(counts[0], 0.5 * n, 1.0);
    EXPECT_NEAR(counts[1], 0.3 * n, 1.0);
    EXPECT_NEAR(counts[2], 0.2 * n, 1.0);
  }
  // Each dataset wrapped its epochs on its own (b holds 120 tokens: 14 sequences).
  EXPECT_GT(loader.cursor().parts[1].epoch, 0);
}

TEST(Blend, SameGlobalBatchOnAnyDp) {
  TempDir dir;
  // Written once: a loader refuses a shard rewritten after it opened it (shards.h).
  const auto sources = three_sources(dir);
  DataLoader whole(sources, 8, 6, 0, 1, 40000);
  DataLoader r0(sources, 8, 6, 0, 3, 40000), r1(sources, 8, 6, 1, 3, 40000), r2(sources, 8, 6, 2, 3, 40000);
  for (int step = 0; step < 15; ++step) {
    Batch w = whole.next(), a = r0.next(), b = r1.next(), c = r2.next();
    EXPECT_TRUE(torch::equal(torch::cat({a.inputs, b.inputs, c.inputs}), w.inputs)) << step;
    EXPECT_TRUE(torch::equal(torch::cat({a.targets, b.targets, c.targets}), w.targets)) << step;
    EXPECT_EQ(r2.cursor(), whole.cursor());
  }
}

TEST(Blend, ResumesFromTheSavedCursor) {
  TempDir dir;
  DataLoader a(three_sources(dir), 8, 4, 0, 1, 40000);
  for (int i = 0; i < 9; ++i) a.next();
  nlohmann::json saved = a.cursor();
  std::vector<Batch> expected;
  for (int i = 0; i < 12; ++i) expected.push_back(a.next());
  DataLoader b(three_sources(dir), 8, 4, 0, 1, 40000);
  b.restore(saved.get<Cursor>());
  for (int i = 0; i < 12; ++i) EXPECT_TRUE(torch::equal(b.next().inputs, expected[static_cast<size_t>(i)].inputs)) << i;
  // A plain cursor does not fit a blend, nor a blend cursor a plain loader.
  EXPECT_NE(error_of([&] { b.restore(Cursor{}); }).find("datasets"), std::string::npos);
  DataLoader plain(std::vector<std::string>{three_sources(dir)[0].files[0]}, ShardFormat::kLlmc, 8, 4, 0, 1, 40000);
  EXPECT_NE(error_of([&] { plain.restore(saved.get<Cursor>()); }).find("blend"), std::string::npos);
}

TEST(Blend, OneSourceIsThePlainStream) {
  TempDir dir;
  auto src = counting_source(dir / "a", 0, {300}, 7.0);
  DataLoader blended(std::vector<DataSource>{src}, 8, 4, 0, 1, 40000);
  DataLoader plain(src.files, ShardFormat::kLlmc, 8, 4, 0, 1, 40000);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(torch::equal(blended.next().inputs, plain.next().inputs));
  EXPECT_EQ(nlohmann::json(blended.cursor()).dump(), nlohmann::json(plain.cursor()).dump());
}

}  // namespace
}  // namespace meshtrain
