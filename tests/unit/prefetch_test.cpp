// The batch prefetcher (data/prefetcher.h): the same batches in the same
// order as the loader alone, under batch-size rampup and gradient
// accumulation, on any dp rank, for blends; the loader's cursor is that of
// the batches consumed (what a checkpoint saves), and a save/restore of it,
// in the same process or in a fresh one, goes on with the same batches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data_test_util.h"
#include "meshtrain/config/config.h"
#include "meshtrain/data/prefetcher.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/optim/rampup.h"

using namespace meshtrain;

namespace {

constexpr int64_t kT = 8;

// Two shards of distinct tokens, so any shift in the stream shows.
std::string write_data(const test::TempDir& dir) {
  std::filesystem::create_directories(dir / "train");
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> tokens(1500 + 300 * s);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + s * 13) % 1000);
    write_shard((dir / "train" / ("train_00000" + std::to_string(s) + ".bin")).string(), tokens);
  }
  return (dir / "train").string();
}

// Rampup 2 -> 16 by 2 over 96 samples, two accumulation rounds a step.
Config rampup_config() {
  Config c;
  c.data.T = kT;
  c.data.train_batch_size = 16;
  c.grad_step = 2;
  c.rampup_batch_size = {2, 2, 96};
  return c;
}

void expect_same_batch(const Batch& a, const Batch& b, const std::string& what) {
  ASSERT_TRUE(a.inputs.equal(b.inputs)) << what;
  ASSERT_TRUE(a.targets.equal(b.targets)) << what;
}

// Steps the trainer's way: every round of a step takes the batch of the
// step's start, the prefetcher told the next round's size.
struct Walk {
  const Config& cfg;
  int64_t consumed = 0;
  template <class F>
  void steps(int n, F&& round) {
    for (int s = 0; s < n; ++s) {
      const int64_t batch = global_batch_at(cfg, consumed);
      for (int64_t r = 0; r < cfg.grad_step; ++r) round(batch, round_batch_at(cfg, consumed, r + 1));
      consumed += batch * cfg.grad_step;
    }
  }
};

}  // namespace

TEST(RoundBatches, NextRoundsFollowTheRampup) {
  const Config c = rampup_config();
  int64_t consumed = 0;
  std::vector<int64_t> rounds;  // every round of 20 steps, in order
  for (int s = 0; s < 20; ++s) {
    const int64_t b = global_batch_at(c, consumed);
    for (int64_t r = 0; r < c.grad_step; ++r) rounds.push_back(b);
    consumed += b * c.grad_step;
  }
  EXPECT_NE(rounds.front(), rounds.back());  // the rampup moved
  for (size_t k = 0; k < rounds.size(); ++k) EXPECT_EQ(round_batch_at(c, 0, static_cast<int64_t>(k)), rounds[k]) << k;
  // From the start of step 3 on.
  int64_t at3 = 0;
  for (int s = 0; s < 3; ++s) at3 += global_batch_at(c, at3) * c.grad_step;
  EXPECT_EQ(round_batch_at(c, at3, 1), rounds[7]);
  EXPECT_EQ(round_batch_at(c, at3, 2), rounds[8]);
}

TEST(Prefetcher, SameBatchesAsTheLoaderUnderRampup) {
  test::TempDir dir;
  const std::string folder = write_data(dir);
  const Config cfg = rampup_config();
  for (int dp_rank : {0, 1}) {
    DataLoader plain(folder, kT, 16, dp_rank, 2, 1000), fed(folder, kT, 16, dp_rank, 2, 1000);
    BatchPrefetcher pf(fed, /*pin=*/false);
    Walk w{cfg};
    int n = 0;
    w.steps(30, [&](int64_t batch, int64_t following) {  // past the end of the shards: epochs wrap
      const std::string what = "dp rank " + std::to_string(dp_rank) + ", round " + std::to_string(n++);
      expect_same_batch(plain.next(batch), pf.next(batch, following), what);
      // The cursor is the consumed one, not the prefetched one.
      EXPECT_EQ(fed.cursor(), plain.cursor()) << what;
    });
    EXPECT_EQ(pf.hits(), n - 1);  // every batch but the first was read ahead
    EXPECT_GT(fed.cursor().epoch, 0);
  }
}

TEST(Prefetcher, SaveAndRestoreOfTheCursorGoOnWithTheSameBatches) {
  test::TempDir dir;
  const std::string folder = write_data(dir);
  const Config cfg = rampup_config();
  DataLoader plain(folder, kT, 16, 0, 1, 1000), fed(folder, kT, 16, 0, 1, 1000);
  BatchPrefetcher pf(fed, false);
  Walk w{cfg};
  w.steps(5, [&](int64_t b, int64_t f) { expect_same_batch(plain.next(b), pf.next(b, f), "before the save"); });
  // A checkpoint now, with the next batch already read ahead.
  const Cursor saved = fed.cursor();
  ASSERT_EQ(saved, plain.cursor());
  const int64_t consumed_at_save = w.consumed;
  std::vector<Batch> expected;
  Walk after{cfg, consumed_at_save};
  after.steps(6, [&](int64_t b, int64_t) { expected.push_back(plain.next(b)); });

  // Training goes on past the save, then resumes from it in the same process.
  w.steps(3, [&](int64_t b, int64_t f) { pf.next(b, f); });
  fed.restore(saved);
  Walk resumed{cfg, consumed_at_save};
  size_t i = 0;
  resumed.steps(6, [&](int64_t b, int64_t f) {
    expect_same_batch(expected.at(i), pf.next(b, f), "resumed in place, round " + std::to_string(i));
    ++i;
  });

  // And in a fresh process: a new loader restored, a new prefetcher.
  DataLoader fresh(folder, kT, 16, 0, 1, 1000);
  fresh.restore(saved);
  BatchPrefetcher pf2(fresh, false);
  Walk again{cfg, consumed_at_save};
  i = 0;
  again.steps(6, [&](int64_t b, int64_t f) {
    expect_same_batch(expected.at(i), pf2.next(b, f), "resumed fresh, round " + std::to_string(i));
    ++i;
  });
}

// A size other than the one read ahead (a caller that changed its mind)
// reads again from the consumed position: nothing is skipped.
TEST(Prefetcher, AnotherSizeThanReadAheadIsReadAgain) {
  test::TempDir dir;
  const std::string folder = write_data(dir);
  DataLoader plain(folder, kT, 16, 0, 1, 1000), fed(folder, kT, 16, 0, 1, 1000);
  BatchPrefetcher pf(fed, false);
  expect_same_batch(plain.next(4), pf.next(4, 8), "first");
  expect_same_batch(plain.next(6), pf.next(6, 0), "another size");
  EXPECT_EQ(pf.hits(), 0);
  expect_same_batch(plain.next(6), pf.next(6, 6), "nothing read ahead");
  expect_same_batch(plain.next(6), pf.next(6, 6), "read ahead");
  EXPECT_EQ(pf.hits(), 1);
  EXPECT_EQ(fed.cursor(), plain.cursor());
}

TEST(Prefetcher, BlendsGiveTheSameBatches) {
  test::TempDir dir;
  const std::string folder = write_data(dir);
  std::vector<DataSource> sources = {{list_shards(folder), ShardFormat::kLlmc, 2.0},
                                     {{list_shards(folder).back()}, ShardFormat::kLlmc, 1.0}};
  DataLoader plain(sources, kT, 16, 1, 2, 1000), fed(sources, kT, 16, 1, 2, 1000);
  BatchPrefetcher pf(fed, false);
  const Config cfg = rampup_config();
  Walk w{cfg};
  w.steps(12, [&](int64_t b, int64_t f) {
    expect_same_batch(plain.next(b), pf.next(b, f), "blend");
    EXPECT_EQ(fed.cursor(), plain.cursor());
  });
}
