// ckpt/checkpointer.h: components save and load their own state; a resume
// takes the newest complete checkpoint, falls back past incomplete or corrupt
// ones, refuses when none can be read, and never deletes or overwrites a
// checkpoint it could not read.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "local_communicator.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/ckpt/checkpointer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// A weight and its "moment": two tensors, like the model and the optimizer.
class Weights : public Stateful {
 public:
  at::Tensor w = torch::zeros({4, 2});
  at::Tensor m = torch::zeros({4, 2});
  ComponentState state() const override {
    ComponentState s;
    s.tensors.push_back({"w", w.clone(), {{4, 2}}});
    s.tensors.push_back({"m", m.clone(), {{4, 2}}});
    return s;
  }
  void load_state(const ComponentReader& in) override {
    for (const char* name : {"w", "m"})
      if (!in.has(name)) throw Error("checkpoint " + in.dir() + " is incomplete: no tensor " + in.full_name(name));
    w.copy_(in.read("w"));
    m.copy_(in.read("m"));
  }
};

class Counter : public Stateful {
 public:
  int64_t value = 0;
  ComponentState state() const override {
    ComponentState s;
    s.values["value"] = value;
    return s;
  }
  void load_state(const ComponentReader& in) override { value = in.values().at("value").get<int64_t>(); }
};

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("mt_checkpointer_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    run_ = (dir_ / "run").string();
    ckpt_ = std::make_unique<Checkpointer>(run_, world_, 3);
    ckpt_->add("model", weights_);
    ckpt_->add("counter", counter_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void save(int64_t step) {
    weights_.w.fill_(static_cast<float>(step));
    weights_.m.fill_(static_cast<float>(-step));
    counter_.value = step;
    ckpt_->save(step, {{"step", step}});
  }
  // A fresh process resuming: new components, new checkpointer.
  std::optional<int64_t> resume(Checkpointer::Check check = [](const std::string&, const nlohmann::json&) {}) {
    Checkpointer c(run_, world_, 3);
    c.add("model", weights_);
    c.add("counter", counter_);
    weights_.w.zero_();
    counter_.value = 0;
    auto found = c.load_newest(check);
    unreadable_ = c.unreadable();
    if (!found) return std::nullopt;
    EXPECT_EQ(found->second.at("step").get<int64_t>(), counter_.value);
    EXPECT_TRUE(at::equal(weights_.w, torch::full({4, 2}, static_cast<float>(counter_.value))));
    return counter_.value;
  }
  fs::path step_dir(int64_t step) const {
    char name[32];
    std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
    return fs::path(run_) / "checkpoints" / name;
  }
  void drop_manifest_entry(int64_t step, const std::string& tensor) {
    const fs::path p = step_dir(step) / "manifest.json";
    nlohmann::json m = nlohmann::json::parse(std::ifstream(p));
    m["tensors"].erase(tensor);
    std::ofstream(p) << m.dump(2);
  }

  fs::path dir_;
  std::string run_;
  LocalCommunicator world_;
  Weights weights_;
  Counter counter_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::vector<std::string> unreadable_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_F(CheckpointerTest, ComponentsRoundTripUnderTheirPrefixes) {
  save(10);
  const CheckpointReader r(step_dir(10).string());
  EXPECT_TRUE(r.has("model.w"));
  EXPECT_TRUE(r.has("model.m"));
  EXPECT_EQ(r.trainer_state()["components"]["counter"]["value"], 10);
  EXPECT_EQ(resume(), 10);
  EXPECT_TRUE(at::equal(weights_.m, torch::full({4, 2}, -10.0f)));
  EXPECT_FALSE(Checkpointer(dir_.string() + "/none", world_, 3).load_newest({}));
}

TEST_F(CheckpointerTest, IncompleteCheckpointIsSkippedForThePreviousOne) {
  save(10);
  save(20);
  drop_manifest_entry(20, "model.m");  // e.g. the optimizer's moments missing
  EXPECT_EQ(resume(), 10);
  EXPECT_EQ(unreadable_, std::vector<std::string>{"step_00000020"});
}

TEST_F(CheckpointerTest, NewestStepWinsOverAStaleLatest) {
  save(10);
  save(20);
  std::ofstream(fs::path(run_) / "checkpoints" / "latest") << "step_00000010\n";
  EXPECT_EQ(resume(), 20);
}

TEST_F(CheckpointerTest, AllUnreadableRefusesAndTouchesNothing) {
  save(10);
  save(20);
  drop_manifest_entry(10, "model.w");
  fs::resize_file(step_dir(20) / "rank_00000.safetensors", 10);
  const std::string err = error_of([&] { resume(); });
  EXPECT_NE(err.find("none can be read"), std::string::npos) << err;
  EXPECT_NE(err.find("--fresh"), std::string::npos) << err;
  EXPECT_NE(err.find("step_00000010"), std::string::npos) << err;
  EXPECT_NE(err.find("step_00000020"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(step_dir(10)));
  EXPECT_TRUE(fs::exists(step_dir(20)));
}

TEST_F(CheckpointerTest, UnreadableCheckpointsAreNeverPrunedNorOverwritten) {
  save(10);
  save(20);
  fs::resize_file(step_dir(10) / "rank_00000.safetensors", 10);
  fs::resize_file(step_dir(20) / "rank_00000.safetensors", 10);
  Checkpointer fresh(run_, world_, 1);  // keeps one: would prune everything older
  fresh.add("model", weights_);
  fresh.add("counter", counter_);
  fresh.protect_unreadable();
  EXPECT_EQ(fresh.unreadable().size(), 2u);
  counter_.value = 5;
  fresh.save(20, {{"step", 20}});  // the step of an unreadable one
  fresh.save(30, {{"step", 30}});
  EXPECT_TRUE(fs::exists(step_dir(10)));
  EXPECT_TRUE(fs::exists(step_dir(20).string() + ".unreadable"));
  EXPECT_FALSE(fs::exists(step_dir(20)));  // the readable re-save was pruned (max_to_keep 1)
  EXPECT_TRUE(fs::exists(step_dir(30)));
}

TEST_F(CheckpointerTest, RefusalStopsWithoutFallingBack) {
  save(10);
  save(20);
  const std::string err = error_of([&] {
    resume([](const std::string& dir, const nlohmann::json&) { throw Error("refused " + dir); });
  });
  EXPECT_NE(err.find("refused"), std::string::npos) << err;
  EXPECT_NE(err.find("step_00000020"), std::string::npos) << err;
}

TEST_F(CheckpointerTest, ResumingFromFurtherBackSetsNewerOnesAside) {
  save(10);
  save(20);
  save(30);
  // A run restarted from step 10 saves 15: 20 and 30 are another history.
  save(15);
  EXPECT_TRUE(fs::exists(step_dir(20).string() + ".superseded"));
  EXPECT_TRUE(fs::exists(step_dir(30).string() + ".superseded"));
  EXPECT_EQ(resume(), 15);
}

// Issue 47: what a run is pointed at is never read when no resume would read
// it, nor deleted by its next save.
TEST_F(CheckpointerTest, StagingSupersededAndUnreadableFoldersAreRefusedByName) {
  save(10);
  const fs::path root = fs::path(run_) / "checkpoints";
  fs::copy(step_dir(10), root / "step_00000020.tmp-4242");  // a killed save's leftover, manifest and all
  fs::copy(step_dir(10), root / "step_00000030.superseded");
  fs::copy(step_dir(10), root / "step_00000040.unreadable.1");
  const auto load = [&](const fs::path& dir) {
    Checkpointer c(run_, world_, 3);
    c.add("model", weights_);
    c.add("counter", counter_);
    return error_of([&] { c.load(dir.string(), {}); });
  };
  EXPECT_NE(load(root / "step_00000020.tmp-4242").find("is a staging folder"), std::string::npos);
  EXPECT_NE(load(root / "step_00000020.tmp-4242/").find("is a staging folder"), std::string::npos);
  EXPECT_NE(load(root / "step_00000030.superseded").find("set aside as superseded"), std::string::npos);
  EXPECT_NE(load(root / "step_00000040.unreadable.1").find("set aside as unreadable"), std::string::npos);
  EXPECT_EQ(load(step_dir(10)), "");
  // The refused staging folder was not read, so the next save removing it
  // (a leftover) removes nothing the run loaded.
  EXPECT_EQ(set_aside_checkpoint(step_dir(10).string()), "");
  EXPECT_EQ(set_aside_checkpoint((dir_ / "elsewhere" / "my_copy").string()), "");
}

TEST_F(CheckpointerTest, NonFiniteWeightsAreNamedAndTheOneBeforeLoads) {
  save(10);
  weights_.w.fill_(20.0f);
  weights_.w[1][1] = std::numeric_limits<float>::quiet_NaN();
  weights_.m.fill_(-20.0f);
  counter_.value = 20;
  ckpt_->save(20, {{"step", 20}});
  // Loaded as the newest, it trained as a run of skipped steps; now it is skipped, naming the tensor.
  EXPECT_EQ(resume(), 10);
  ASSERT_EQ(unreadable_.size(), 1u);
  EXPECT_EQ(unreadable_[0], "step_00000020");
  Checkpointer c(run_, world_, 3);
  c.add("model", weights_);
  c.add("counter", counter_);
  const std::string err = error_of([&] { c.load(step_dir(20).string(), {}); });
  EXPECT_NE(err.find("the weights of checkpoint " + step_dir(20).string() + " hold NaN or inf"), std::string::npos)
      << err;
  EXPECT_NE(err.find("tensor 'model.w' has 1 non-finite value(s) of 8"), std::string::npos) << err;
  // Any floating-point tensor alike (here the second of the component; optim.* says "the saved state").
  weights_.w.fill_(30.0f);
  weights_.m.fill_(std::numeric_limits<float>::infinity());
  ckpt_->save(30, {{"step", 30}});
  const std::string err2 = error_of([&] { c.load(step_dir(30).string(), {}); });
  EXPECT_NE(err2.find("tensor 'model.m' has 8 non-finite value(s) of 8"), std::string::npos) << err2;
}

TEST_F(CheckpointerTest, LatestThatCannotBeWrittenDoesNotFailACompleteSave) {
  save(10);
  const fs::path latest = fs::path(run_) / "checkpoints" / "latest";
  fs::remove(latest);
  fs::create_directories(latest / "inside");  // a folder in the way of the pointer
  EXPECT_EQ(error_of([&] { save(20); }), "");  // was: the save "failed" after the rename
  EXPECT_TRUE(fs::exists(step_dir(20) / "manifest.json"));
  EXPECT_EQ(resume(), 20);
  // Train checks it at start-up instead, before any step.
  const std::string err = error_of([&] { require_checkpoint_root(run_); });
  EXPECT_NE(err.find("the checkpoint pointer " + latest.string() + " is a directory"), std::string::npos) << err;
  fs::remove_all(latest);
  EXPECT_EQ(error_of([&] { require_checkpoint_root(run_); }), "");
}

}  // namespace
}  // namespace meshtrain
