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
  saved.model.n_kv_head = 2;
  saved.model.vocab_size = 1024;
  Config now;
  const ResumeDiff d = compare_for_resume(to_json(saved), now);
  ASSERT_EQ(d.refused.size(), 4u);
  EXPECT_TRUE(mentions(d.refused, "model_config.n_head: 8 in the checkpoint, 4 now"));
  EXPECT_TRUE(mentions(d.refused, "model_config.blocks: 3 in the checkpoint, 1 now"));
  EXPECT_TRUE(mentions(d.refused, "model_config.n_kv_head: 2 in the checkpoint, 4 now"));  // 0 now: as n_head
  EXPECT_TRUE(mentions(d.refused, "model_config.vocab_size: 1024"));
  EXPECT_TRUE(d.warned.empty());
}

// Issue 47: --init-from-hf on a run with checkpoints refused the same model
// as "different": its config spells out what the file left at a default.
TEST(ResumeConfig, TheSameModelSpelledOtherwiseIsNoChange) {
  Config file;  // as a config file leaves it: mlp_hidden 0 (4 * d), n_kv_head 0, 2 blocks of 2 layers
  file.model.blocks = 2;
  file.model.n_head = 4;
  Config hf = file;  // as model_config_from_hf spells the same model
  hf.model.mlp_hidden = 4 * file.model.model_dimension;
  hf.model.n_kv_head = 4;
  hf.model.blocks = 1;
  hf.model.layers_per_block = 4;
  hf.model.mla_last_layer_no_rope = !file.model.mla_last_layer_no_rope;  // an MHA model has no MLA rope
  hf.model.architecture = Architecture::Meshtrain;
  ResumeDiff d = compare_for_resume(to_json(file), hf);
  EXPECT_TRUE(d.refused.empty()) << d.refused.front();
  d = compare_for_resume(to_json(hf), file);
  EXPECT_TRUE(d.refused.empty()) << d.refused.front();
  // What does change the model is still refused, as written.
  hf.model.mlp_hidden = 3 * file.model.model_dimension;
  hf.model.layers_per_block = 3;
  d = compare_for_resume(to_json(file), hf);
  EXPECT_TRUE(mentions(d.refused, "model_config.mlp_hidden: 256 in the checkpoint, 192 now")) << d.refused.size();
  EXPECT_TRUE(mentions(d.refused, "model_config.blocks: 2 in the checkpoint, 1 now"));
  // Blocks that decide the MoE layers are compared as they are.
  file.model.ffn = hf.model.ffn = FfnKind::Moe;
  file.model.n_experts = hf.model.n_experts = 4;
  file.model.moe_layers = hf.model.moe_layers = MoeLayers::LastInBlock;
  hf.model.mlp_hidden = 4 * file.model.model_dimension;
  hf.model.layers_per_block = 4;
  d = compare_for_resume(to_json(file), hf);
  EXPECT_TRUE(mentions(d.refused, "model_config.blocks: 2 in the checkpoint, 1 now"));
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
