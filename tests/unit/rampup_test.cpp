// Batch-size rampup (Megatron) and sequence-length warmup (DeepSpeed
// fixed_linear): the values, and the steps on which they change.
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/optim/rampup.h"

using namespace meshtrain;

namespace {

Config base() {
  Config c;
  c.data.T = 64;
  c.model.T = 64;
  c.data.train_batch_size = 16;
  return c;
}

// Batch sizes of steps 0..n-1 as the trainer consumes them.
std::vector<int64_t> batches(const Config& c, int n) {
  std::vector<int64_t> out;
  int64_t consumed = 0;
  for (int s = 0; s < n; ++s) {
    out.push_back(global_batch_at(c, consumed));
    consumed += out.back() * c.grad_step;
  }
  return out;
}

}  // namespace

TEST(Rampup, OffIsTheFullBatch) {
  Config c = base();
  EXPECT_EQ(global_batch_at(c, 0), 16);
  EXPECT_EQ(global_batch_at(c, 12345), 16);
}

TEST(Rampup, GrowsByIncrementEverySamplesOverIncrements) {
  Config c = base();
  c.rampup_batch_size = {4, 4, 120};  // 3 increments, one every 40 samples
  EXPECT_EQ(global_batch_at(c, 0), 4);
  EXPECT_EQ(global_batch_at(c, 39), 4);
  EXPECT_EQ(global_batch_at(c, 40), 8);
  EXPECT_EQ(global_batch_at(c, 79), 8);
  EXPECT_EQ(global_batch_at(c, 80), 12);
  EXPECT_EQ(global_batch_at(c, 119), 12);
  EXPECT_EQ(global_batch_at(c, 120), 16);
  EXPECT_EQ(global_batch_at(c, 1000000), 16);
  // Per step: 10 steps of 4 (40 samples), 5 of 8 (40), 4 of 12 (48 -> 128), then 16.
  const auto b = batches(c, 22);
  std::vector<int64_t> expected(10, 4);
  expected.insert(expected.end(), 5, 8);
  expected.insert(expected.end(), 4, 12);
  expected.insert(expected.end(), 3, 16);
  EXPECT_EQ(b, expected);
}

TEST(Rampup, FractionalSamplesPerIncrementAsMegatron) {
  Config c = base();
  c.rampup_batch_size = {4, 4, 100};  // 33.33 samples per increment
  EXPECT_EQ(global_batch_at(c, 33), 4);
  EXPECT_EQ(global_batch_at(c, 34), 8);
  EXPECT_EQ(global_batch_at(c, 66), 8);
  EXPECT_EQ(global_batch_at(c, 67), 12);
  EXPECT_EQ(global_batch_at(c, 100), 16);
}

TEST(Rampup, ValidationNamesTheKey) {
  Config c = base();
  c.device.n_device_axis = {2, 1, 1};
  c.rampup_batch_size = {2, 2, 100};
  EXPECT_NO_THROW(validate(c));
  c.rampup_batch_size = {4, 3, 100};  // 16 - 4 is not a multiple of 3
  EXPECT_THROW(validate(c), Error);
  c.rampup_batch_size = {3, 1, 100};  // odd start on dp 2
  try {
    validate(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rampup_batch_size"), std::string::npos) << e.what();
  }
  c.rampup_batch_size = {4, 4};
  EXPECT_THROW(validate(c), Error);
  c.rampup_batch_size = {4, 4, 100};
  c.data.micro_batch_size = 4;  // dp * micro = 8 does not divide 4
  EXPECT_THROW(validate(c), Error);
}

TEST(SeqLenWarmup, OffIsT) {
  Config c = base();
  EXPECT_EQ(seq_len_at(c, 0), 64);
  EXPECT_EQ(seq_len_at(c, 1000), 64);
}

TEST(SeqLenWarmup, FixedLinearValues) {
  Config c = base();
  c.seq_len_warmup = {8, 8, 10};
  // min + (T - min) * s / total = 8 + 5.6 s, floored to a multiple of 8.
  const std::vector<int64_t> expected = {8, 8, 16, 24, 24, 32, 40, 46 / 8 * 8, 48, 56, 64, 64, 64};
  for (int s = 0; s < static_cast<int>(expected.size()); ++s) EXPECT_EQ(seq_len_at(c, s), expected[s]) << "step " << s;
  // DeepSpeed's float formula agrees on every step.
  for (int s = 0; s <= 20; ++s) {
    double d = std::floor(8 + (64 - 8) * std::min(1.0, s / 10.0));
    int64_t want = static_cast<int64_t>(d) - static_cast<int64_t>(d) % 8;
    EXPECT_EQ(seq_len_at(c, s), std::max<int64_t>(8, std::min<int64_t>(64, want))) << "step " << s;
  }
}

TEST(SeqLenWarmup, NeverBelowMinNorAboveT) {
  Config c = base();
  c.seq_len_warmup = {12, 8, 4};  // min not a multiple of step: floor would give 8
  EXPECT_EQ(seq_len_at(c, 0), 12);
  EXPECT_EQ(seq_len_at(c, 1), 24);  // 12 + 13 = 25 -> 24
  EXPECT_EQ(seq_len_at(c, 4), 64);
  c.seq_len_warmup = {8, 7, 3};  // T is not a multiple of the step: the end is T
  EXPECT_EQ(seq_len_at(c, 3), 63);
  EXPECT_EQ(seq_len_at(c, 100), 63);
}

TEST(SeqLenWarmup, Validation) {
  Config c = base();
  c.seq_len_warmup = {0, 8, 10};
  EXPECT_THROW(validate(c), Error);
  c.seq_len_warmup = {100, 8, 10};
  EXPECT_THROW(validate(c), Error);
  c.seq_len_warmup = {8, 0, 10};
  EXPECT_THROW(validate(c), Error);
  c.seq_len_warmup = {8, 8, 10};
  EXPECT_NO_THROW(validate(c));
}

TEST(Config, RampupKeysLoadFromJson) {
  nlohmann::json j = {{"rampup_batch_size", {4, 4, 120}},
                      {"seq_len_warmup", {{"min_difficulty", 8}, {"total_curriculum_step", 10}}}};
  Config c = config_from_json(j);
  EXPECT_EQ(c.rampup_batch_size, (std::vector<int64_t>{4, 4, 120}));
  EXPECT_EQ(c.seq_len_warmup.min_difficulty, 8);
  EXPECT_EQ(c.seq_len_warmup.difficulty_step, 8);
  EXPECT_EQ(c.seq_len_warmup.total_curriculum_step, 10);
  EXPECT_EQ(config_from_json(to_json(c)).rampup_batch_size, c.rampup_batch_size);
  nlohmann::json bad = {{"rampup_batch_size", {4, 1.5, 120}}};
  EXPECT_THROW(config_from_json(bad), Error);
  apply_override(j, "rampup_batch_size=[2,2,50]");
  EXPECT_EQ(config_from_json(j).rampup_batch_size, (std::vector<int64_t>{2, 2, 50}));
}
