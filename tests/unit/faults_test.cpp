// Small pieces of "never lose a run": the watchdog's naming of stuck ranks,
// the run-directory lock, the repair of a half-written metrics.jsonl line,
// and messages that survive a NUL.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/core/run_lock.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/core/watchdog.h"
#include "meshtrain/metrics/metrics.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("mt_faults_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(Watchdog, NamesTheRankThatFellBehind) {
  const std::vector<RankProgress> ranks = {
      {0, true, 13, "train step 5"}, {1, true, 12, "train step 4"}, {2, true, 13, "train step 5"}};
  const std::string msg = describe_stuck_ranks(ranks);
  EXPECT_NE(msg.find("stuck: rank 1 (stopped in 'train step 4')"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("rank 0"), std::string::npos) << msg;
}

TEST(Watchdog, SilentRanksAndNoLaggard) {
  std::string msg = describe_stuck_ranks({{0, true, 3, "start-up: model"}, {1, false, 0, ""}});
  EXPECT_NE(msg.find("no progress ever reported by rank(s) 1"), std::string::npos) << msg;
  msg = describe_stuck_ranks({{0, true, 7, "saving"}, {1, true, 7, "saving"}});
  EXPECT_NE(msg.find("no rank is behind"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'saving': 0, 1"), std::string::npos) << msg;
}

TEST(RunLock, SecondHolderIsRefusedNamingTheFirst) {
  const fs::path dir = scratch("lock");
  {
    RunLock first(dir.string());
    try {
      RunLock second(dir.string());
      ADD_FAILURE() << "a second lock on the same run dir was granted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("in use by another run"), std::string::npos) << msg;
      EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
    }
  }
  RunLock again(dir.string());  // released with its holder
  fs::remove_all(dir);
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(Metrics, HalfWrittenLastLineIsCutBeforeAppending) {
  const fs::path dir = scratch("metrics");
  std::ofstream(dir / "metrics.jsonl") << "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"lo";
  {
    MetricsLogger m(dir.string(), true, false);
    m.log({{"step", 2}, {"loss", 2.4}});
  }
  const auto lines = lines_of(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[1])["step"], 2);
  // A file of only a partial line becomes empty; complete files are left alone.
  std::ofstream(dir / "metrics.jsonl", std::ios::trunc) << "{\"step\":1";
  { MetricsLogger m(dir.string(), true, false); }
  EXPECT_EQ(fs::file_size(dir / "metrics.jsonl"), 0u);
  fs::remove_all(dir);
}

TEST(Messages, NulDoesNotCutAnError) {
  try {
    MT_CHECK(false, "key 'a", std::string("\0b", 2), "' is bad");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'a\\0b' is bad"), std::string::npos) << e.what();
  }
}

TEST(Stopped, NamesSignalAndPhase) {
  const Stopped s(2, "sampling");
  EXPECT_NE(std::string(s.what()).find("stopped by SIGINT during sampling"), std::string::npos) << s.what();
  EXPECT_EQ(s.signal_number(), 2);
  EXPECT_NO_THROW(throw_if_stop_requested("nothing"));  // no signal arrived
}

}  // namespace
}  // namespace meshtrain
