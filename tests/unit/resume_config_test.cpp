// config/resume.h: what may change when a checkpoint is resumed. A change of a
// key that shapes the model is refused naming the key and both values; the
// documented resumable keys pass silently; anything else warns.
#include <gtest/gtest.h>

#include "meshtrain/config/load.h"
#include "meshtrain/config/resume.h"

namespace meshtrain {
namespace {

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

TEST(ResumeConfig, SameConfigIsNoChange) {
  const Config c;
  const ResumeDiff d = compare_for_resume(to_json(c), c);
  EXPECT_TRUE(d.refused.empty());
  EXPECT_TRUE(d.warned.empty());
}

TEST(ResumeConfig, ModelShapingChangesAreRefusedWithBothValues) {
  Config saved;
  saved.model.n_head = 8;
  saved.model.blocks = 3;
  saved.model.n_shared = 2;
  saved.model.vocab_size = 1024;
  Config now;
  const ResumeDiff d = compare_for_resume(to_json(saved), now);
  ASSERT_EQ(d.refused.size(), 4u);
  EXPECT_TRUE(mentions(d.refused, "model_config.n_head: 8 in the checkpoint, 4 now"));
  EXPECT_TRUE(mentions(d.refused, "model_config.blocks: 3 in the checkpoint, 1 now"));
  EXPECT_TRUE(mentions(d.refused, "model_config.n_shared"));
  EXPECT_TRUE(mentions(d.refused, "model_config.vocab_size: 1024"));
  EXPECT_TRUE(d.warned.empty());
}

TEST(ResumeConfig, ResumableKeysPassOthersWarn) {
  Config saved;
  Config now;
  now.training_steps = 5000;
  now.lr.max_lr = 3e-4;
  now.data.train_batch_size = 16;
  now.device.n_device_axis = {2, 1, 1};
  now.name = "elsewhere";
  now.checkpoint_steps = 7;
  now.inference.prompt = "x";
  now.seed = 99;                 // not in the resumable list: warned
  now.model.dropout_rate = 0.1;  // changes training, not the parameters: warned
  const ResumeDiff d = compare_for_resume(to_json(saved), now);
  EXPECT_TRUE(d.refused.empty());
  ASSERT_EQ(d.warned.size(), 2u);
  EXPECT_TRUE(mentions(d.warned, "seed: 0 in the checkpoint, 99 now"));
  EXPECT_TRUE(mentions(d.warned, "model_config.dropout_rate"));
}

// The moments convert as they load (optim/adamw.h): a switch resumes, and
// the log names the key.
TEST(ResumeConfig, OptimizerStateDtypeChangeWarnsNamingTheKey) {
  Config saved;
  Config now;
  now.optimizer_state_dtype = ModelDtype::Bfloat16;
  const ResumeDiff d = compare_for_resume(to_json(saved), now);
  EXPECT_TRUE(d.refused.empty());
  ASSERT_EQ(d.warned.size(), 1u);
  EXPECT_TRUE(mentions(d.warned, "optimizer_state_dtype: \"float32\" in the checkpoint, \"bfloat16\" now"));
}

TEST(ResumeConfig, KeysMissingOnEitherSideAreNotCompared) {
  nlohmann::json saved = to_json(Config{});
  saved["model_config"].erase("n_head");
  saved["some_future_key"] = 3;
  Config now;
  now.model.n_head = 2;
  const ResumeDiff d = compare_for_resume(saved, now);
  EXPECT_TRUE(d.refused.empty());
  EXPECT_TRUE(d.warned.empty());
  EXPECT_TRUE(compare_for_resume(nlohmann::json(), now).refused.empty());
}

}  // namespace
}  // namespace meshtrain
