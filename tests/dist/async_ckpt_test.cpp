// async_checkpoint writes what a synchronous save writes: the same run
// trained with checkpoints written in the background (each writer snapshots
// its shards, a thread writes them, a later step commits) leaves checkpoint
// files byte for byte those of the synchronous run -- dense and MoE, zero
// stages 0, 1 and 3, pipeline and tensor parallel meshes -- and
// trainer_state.json differs only in the async_checkpoint key itself.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint_steps.h"
#include "ckpt_cases.h"

using namespace meshtrain;

namespace {

namespace fs = std::filesystem;

const std::string kData = test::scratch_dir("async-ckpt-data");

using test::SaveCase;

Config config(const SaveCase& k, int stage, bool async) {
  Config c = test::save_case_config(k, stage, kData, async ? "async" : "sync");
  c.training_steps = 5;
  c.checkpoint_steps = 2;  // saves 2 and 4 in flight while training goes on, 5 at the end
  c.max_to_keep = 10;
  c.async_checkpoint = async;
  return c;
}


std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// trainer_state.json without the one key that differs by construction.
nlohmann::json state_without_mode(const fs::path& dir) {
  auto j = nlohmann::json::parse(test::file_contents(dir / "trainer_state.json"));
  j["config"].erase("async_checkpoint");
  j["config"].erase("name");
  return j;
}

void expect_same_checkpoint(const fs::path& sync, const fs::path& async) {
  const auto names = files_in(sync);
  ASSERT_GT(names.size(), 2u) << sync;
  ASSERT_EQ(names, files_in(async)) << sync << " vs " << async;
  for (const auto& name : names) {
    if (name == "trainer_state.json") {
      EXPECT_EQ(state_without_mode(sync), state_without_mode(async)) << "trainer states differ: " << sync;
    } else if (name == "manifest.json") {
      auto a = nlohmann::json::parse(test::file_contents(sync / name));
      auto b = nlohmann::json::parse(test::file_contents(async / name));
      a["files"].erase("trainer_state.json");
      b["files"].erase("trainer_state.json");
      EXPECT_EQ(a, b) << "manifests differ beyond trainer_state.json: " << sync;
    } else {
      EXPECT_TRUE(test::file_contents(sync / name) == test::file_contents(async / name))
          << name << " differs: " << sync << " vs " << async;
    }
  }
}

std::vector<double> train(const Config& c) {
  // The background write of step 2 starts late (a test hook), so training
  // has changed every parameter and moment before it writes: only a true
  // snapshot gives the synchronous files.
  if (c.async_checkpoint) ::setenv("MESHTRAIN_TEST_CKPT_WRITE_DELAY", "2:0.5", 1);
  SessionOptions o;
  o.fresh = true;
  o.quiet = true;
  Trainer t(c, test_runtime(), o);
  ::unsetenv("MESHTRAIN_TEST_CKPT_WRITE_DELAY");
  t.train();
  return t.losses();
}

}  // namespace

TEST(AsyncCheckpoint, FilesMatchTheSynchronousSave) {
  const auto all = test::save_cases(test_runtime().size());
  if (all.empty()) GTEST_SKIP() << "runs at np 2 and 4";
  for (const SaveCase& k : all)
    for (int stage : {0, 1, 3}) {
      SCOPED_TRACE(k.tag() + " zero_stage " + std::to_string(stage));
      const Config sync = config(k, stage, false), async = config(k, stage, true);
      const auto sync_losses = train(sync);
      const auto async_losses = train(async);
      EXPECT_EQ(sync_losses, async_losses) << "a background save changed the training";
      test_runtime().world()->barrier();
      if (test_runtime().rank() != 0) continue;
      for (int64_t step : {2, 4, 5}) {
        SCOPED_TRACE("step " + std::to_string(step));
        const std::string name = checkpoint_dir_name(step);
        expect_same_checkpoint(fs::path(checkpoints_root(sync.run_dir())) / name,
                               fs::path(checkpoints_root(async.run_dir())) / name);
      }
      EXPECT_EQ(test::file_contents(fs::path(checkpoints_root(async.run_dir())) / "latest"),
                checkpoint_dir_name(5) + "\n");
      // No staging dir left behind by a background save.
      for (const auto& e : fs::directory_iterator(checkpoints_root(async.run_dir())))
        EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    }
}
