// Checkpoints across meshes: exact resume on a sharded mesh, and a checkpoint
// saved on one mesh continuing on another as a single process would.
#include <gtest/gtest.h>

#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("reshard-data");

std::vector<double> run(const Config& cfg, bool fresh, const Communicator* world) {
  SessionOptions o;
  o.fresh = fresh;
  o.quiet = true;
  Trainer t(cfg, test_runtime(), o, world);
  t.train();
  return t.losses();
}

Config base(const std::string& name) {
  Config c = test::tiny_config(test::synthetic_data(kData, 96), name);
  c.checkpoint_steps = 4;
  c.training_steps = 8;
  return c;
}

// Trains `c` for 4 steps on (1,1,2) in the first half of a 4-rank world and
// saves it under `name`; the second half trains an unrelated copy so every
// rank stays busy. Returns when all four ranks are done.
void save_on_first_half(Config c, const std::string& name, Communicator& world) {
  const int half = world.rank() < 2 ? 0 : 1;
  auto sub = split_communicator(world, half, world.rank());
  c = test::with_mesh(c, 1, 1, 2);
  c.name = half == 0 ? name : name + "-b";
  c.training_steps = 4;
  run(c, true, sub.get());
  world.barrier();
}

}  // namespace

TEST(Checkpoint, ExactResumeOnShardedMesh) {
  auto world = test_runtime().world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Config c = test::with_mesh(base("exact"), 2, 1, 2);
  const auto straight = run(c, true, world.get());
  Config a = c;
  a.name = "exact-resumed";
  a.training_steps = 4;
  run(a, true, world.get());
  a.training_steps = 8;
  const auto resumed = run(a, false, world.get());
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], straight[4 + i]) << "step " << 5 + i << " not bit-exact";
}

TEST(Checkpoint, ReshardHalvesToFullWorld) {
  auto world = test_runtime().world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Config c = base("reshard-a");
  const auto ref = test::single_process_losses(c);
  save_on_first_half(c, "reshard-a", *world);
  // Continue on (2,2,1) over all four ranks.
  Config second = test::with_mesh(c, 2, 2, 1);
  second.name = "reshard-a";
  second.data.micro_batch_size = 2;
  const auto cont = run(second, false, world.get());
  ASSERT_EQ(cont.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(cont[i], ref[4 + i], 1e-5) << "step " << 5 + i;
}

TEST(Checkpoint, ReshardEightRanksToOneProcess) {
  auto world = test_runtime().world();
  if (world->size() != 8) GTEST_SKIP() << "needs 8 ranks";
  Config c = base("reshard-8");
  c.data.micro_batch_size = 2;
  const auto ref = test::single_process_losses(c);
  Config first = test::with_mesh(c, 2, 2, 2);
  first.training_steps = 4;
  run(first, true, world.get());
  world->barrier();
  // Rank 0 alone continues on (1,1,1); the others wait for it.
  if (world->rank() == 0) {
    auto self = split_communicator(*world, 0, 0);
    const auto cont = run(test::with_mesh(c, 1, 1, 1), false, self.get());
    ASSERT_EQ(cont.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(cont[i], ref[4 + i], 1e-5) << "step " << 5 + i;
  } else {
    split_communicator(*world, 1, world->rank());
  }
  world->barrier();
}

// The vocabulary is padded to a multiple of tp: 95 tokens are 96 rows under
// tp 2 and 95 on one rank. An untied model saved on (1,1,2) continues on
// (4,1,1) like one process.
TEST(Checkpoint, ReshardAcrossVocabularyPadding) {
  auto world = test_runtime().world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Config c = test::tiny_config(test::synthetic_data(kData + "-95", 95), "reshard-vocab");
  c.model.vocab_size = 95;
  c.model.tie_embeddings = false;
  c.checkpoint_steps = 4;
  c.training_steps = 8;
  const auto ref = test::single_process_losses(c);
  save_on_first_half(c, "reshard-vocab", *world);
  const auto cont = run(test::with_mesh(c, 4, 1, 1), false, world.get());
  ASSERT_EQ(cont.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(cont[i], ref[4 + i], 1e-5) << "step " << 5 + i;
}
