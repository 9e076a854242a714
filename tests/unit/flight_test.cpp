// The collective flight recorder (core/flight_recorder.h), its comparison
// across ranks (core/flight_compare.h), the straggler statistics
// (train/straggler.h) and the background save's ownership of what it writes
// (ckpt/background_save.h). Also measures the recorder's cost per op.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "meshtrain/ckpt/background_save.h"
#include "meshtrain/core/flight_compare.h"
#include "meshtrain/core/flight_recorder.h"
#include "meshtrain/train/straggler.h"

using namespace meshtrain;

namespace {

// One rank of a two-rank dp group that ran `ops` all_reduces, the last of
// them still open when `open_last`.
RankFlight rank_with(int rank, int ops, bool open_last) {
  FlightRecorder r(16, rank);
  const int dp = r.add_axis("dp", 0, rank, 2);
  r.set_step(5);
  r.set_phase("train step 5");
  for (int i = 0; i < ops; ++i) {
    const int64_t t = r.begin(dp, "all_reduce", "Float", -1, 64);
    if (!(open_last && i == ops - 1)) r.end(t);
  }
  const auto j = r.to_json("test");
  return {rank, true, "flight file", j["axes"], j["records"]};
}

}  // namespace

TEST(FlightRecorder, NumbersOpsPerAxisAndKeepsTheLastN) {
  FlightRecorder r(4, 0);
  const int dp = r.add_axis("dp", 0, 0, 2), tp = r.add_axis("tp", 0, 0, 2);
  for (int i = 0; i < 5; ++i) r.end(r.begin(dp, "all_reduce", "Float", -1, 8));
  r.set_step(7);
  r.set_phase("evaluation");
  const int64_t open = r.begin(tp, "send", "Float", 1, 16);
  const auto j = r.to_json("why");
  EXPECT_EQ(j["reason"], "why");
  ASSERT_EQ(j["records"].size(), 4u);  // the ring keeps the last 4 of 6
  EXPECT_EQ(j["records"][0]["seq"], 3);
  EXPECT_EQ(j["records"][3]["axis"], "tp");
  EXPECT_EQ(j["records"][3]["seq"], 1);
  EXPECT_EQ(j["records"][3]["peer"], 1);
  EXPECT_EQ(j["records"][3]["step"], 7);
  EXPECT_EQ(j["records"][3]["phase"], "evaluation");
  EXPECT_EQ(j["records"][3]["end_ns"], 0);
  EXPECT_EQ(j["axes"]["dp"]["started"], 5);
  EXPECT_EQ(j["axes"]["tp"]["last"]["in_flight"], true);
  r.end(open);
  EXPECT_EQ(r.axes_json()["tp"]["ended"], 1);
}

TEST(FlightRecorder, OffRecordsNothing) {
  FlightRecorder r(0, 0);
  const int dp = r.add_axis("dp", 0, 0, 2);
  { FlightScope s(&r, dp, "all_reduce", "Float", -1, 8); }
  EXPECT_EQ(r.to_json("x")["records"].size(), 0u);
  EXPECT_FALSE(r.enabled());
}

TEST(FlightCompare, NamesTheRankThatNeverEnteredAndTheOpTheOthersWaitIn) {
  // Rank 1 did 3 ops; rank 0 entered the 4th and waits in it.
  const std::vector<RankFlight> ranks{rank_with(0, 4, true), rank_with(1, 3, false)};
  const std::string msg = describe_flight_lag(ranks);
  EXPECT_NE(msg.find("rank 1 never entered dp op #4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank(s) 0 wait in dp op #4 (all_reduce, step 5)"), std::string::npos) << msg;
  const std::string report = compare_flights(ranks);
  EXPECT_NE(report.find("first diverging op: #4"), std::string::npos) << report;
  EXPECT_NE(report.find("(never entered): rank(s) 1"), std::string::npos) << report;
}

TEST(FlightCompare, NamesARankStuckInAnOlderOp) {
  const std::vector<RankFlight> ranks{rank_with(0, 4, true), rank_with(1, 2, true)};
  const std::string msg = describe_flight_lag(ranks);
  EXPECT_NE(msg.find("rank 1 is stuck in dp op #2 all_reduce (step 5, in it)"), std::string::npos) << msg;
}

TEST(FlightCompare, NoLagNoMessage) {
  const std::vector<RankFlight> ranks{rank_with(0, 3, false), rank_with(1, 3, false)};
  EXPECT_EQ(describe_flight_lag(ranks), "");
  EXPECT_NE(compare_flights(ranks).find("no divergence"), std::string::npos);
}

TEST(FlightCompare, ReadsFilesAndHeartbeatsOfARunDir) {
  namespace fs = std::filesystem;
  const fs::path run = fs::temp_directory_path() / ("flight_test_" + std::to_string(::getpid()));
  fs::remove_all(run);
  fs::create_directories(run / "flight");
  fs::create_directories(run / "heartbeats");
  FlightRecorder r0(8, 0);
  const int dp = r0.add_axis("dp", 0, 0, 2);
  for (int i = 0; i < 3; ++i) r0.begin(dp, "all_reduce", "Float", -1, 4);
  ASSERT_TRUE(r0.write((run / "flight").string(), "test"));
  // Rank 1 was stopped: only its heartbeat's summary (sixth line) exists.
  FlightRecorder r1(8, 1);
  const int dp1 = r1.add_axis("dp", 0, 1, 2);
  r1.end(r1.begin(dp1, "all_reduce", "Float", -1, 4));
  std::FILE* f = std::fopen((run / "heartbeats" / "rank_00001").c_str(), "w");
  std::fprintf(f, "7\ntrain step 3\nhost\n42\njob\n%s\n", r1.axes_json().dump().c_str());
  std::fclose(f);
  const auto ranks = read_flights(run.string(), -1);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[1].source, "heartbeat");
  EXPECT_NE(describe_flight_lag(ranks).find("rank 1 never entered dp op #3 (its last: #1 all_reduce"), std::string::npos)
      << describe_flight_lag(ranks);
  fs::remove_all(run);
}

// Issue 47: a truncated or garbage flight file made `meshtrain flight` say
// "no rank lags on any axis"; what cannot be read is named, never compared.
TEST(FlightCompare, UnreadableFilesAreNamedNotCompared) {
  namespace fs = std::filesystem;
  const fs::path run = fs::temp_directory_path() / ("flight_test_bad_" + std::to_string(::getpid()));
  fs::remove_all(run);
  fs::create_directories(run / "flight");
  FlightRecorder r0(8, 0);
  const int dp = r0.add_axis("dp", 0, 0, 2);
  r0.end(r0.begin(dp, "all_reduce", "Float", -1, 4));
  ASSERT_TRUE(r0.write((run / "flight").string(), "test"));
  const std::string whole = [&] {
    std::ifstream in(run / "flight" / "rank_00000.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const auto with_rank0 = [&](const std::string& text) {
    std::ofstream(run / "flight" / "rank_00000.json", std::ios::trunc) << text;
    return read_flights(run.string(), -1);
  };
  for (const std::string& bad : {whole.substr(0, whole.size() / 2), std::string("\x89PNG garbage"), std::string(),
                                 std::string("{\"axes\": [1, 2]}"), std::string(200000, '[')}) {
    const auto ranks = with_rank0(bad);
    ASSERT_EQ(ranks.size(), 1u);
    EXPECT_FALSE(ranks[0].known);
    EXPECT_NE(ranks[0].problem.find("rank_00000.json cannot be read"), std::string::npos) << ranks[0].problem;
    const std::string report = compare_flights(ranks);
    EXPECT_EQ(report.find("no rank lags"), std::string::npos) << report;
    EXPECT_NE(report.find("could not be compared"), std::string::npos) << report;
  }
  const auto good = with_rank0(whole);
  EXPECT_TRUE(good[0].known);
  EXPECT_EQ(good[0].problem, "");
  fs::remove_all(run);
}

// The straggler report took the ops of step n + 1 (issued before step n is
// read) for step n's: a rank frozen in its work was cancelled out by the
// wait the others spent in the next step's ops.
TEST(FlightRecorder, OpSecondsAreTakenByStep) {
  FlightRecorder r(16, 0);
  const int dp = r.add_axis("dp", 0, 0, 2);
  r.set_step(1);
  r.end(r.begin(dp, "all_reduce", "Float", -1, 4));
  r.set_step(2);
  const int64_t t = r.begin(dp, "all_reduce", "Float", -1, 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  r.end(t);
  const double one = r.take_op_seconds_through(1);
  EXPECT_LT(one, 0.04);
  EXPECT_GE(r.take_op_seconds_through(2), 0.05);
  EXPECT_EQ(r.take_op_seconds(), 0.0);
}

// The cost the recorder adds to every collective and p2p op: two clock
// reads and two uncontended locks. Printed for the note; the bound only
// catches a regression by an order of magnitude.
TEST(FlightRecorder, CostPerOp) {
  FlightRecorder r(2048, 0);
  const int dp = r.add_axis("dp", 0, 0, 2);
  constexpr int kOps = 200000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kOps; ++i) {
    FlightScope s(&r, dp, "all_reduce", "Float", -1, 1024);
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kOps;
  FlightRecorder off(0, 0);
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kOps; ++i) {
    FlightScope s(&off, dp, "all_reduce", "Float", -1, 1024);
  }
  const double off_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t1).count() / kOps;
  std::printf("flight recorder: %.1f ns per recorded op (begin + end), %.1f ns when off\n", ns, off_ns);
  EXPECT_LT(ns, 5000.0);
}

TEST(Straggler, StatsNameTheRankAboveTheThreshold) {
  const auto s = straggler_stats({1.0, 1.1, 2.0, 0.9}, 0.2);
  EXPECT_DOUBLE_EQ(s.min, 0.9);
  EXPECT_DOUBLE_EQ(s.max, 2.0);
  EXPECT_DOUBLE_EQ(s.median, 1.05);
  EXPECT_EQ(s.slowest, 2);
  EXPECT_EQ(straggler_stats({1.0, 1.1, 1.15}, 0.2).slowest, -1);  // 1.15 < 1.1 * 1.2
  EXPECT_EQ(straggler_stats({1.0}, 0).slowest, -1);                // one rank: nobody to compare with
}

TEST(BackgroundSave, OwnsWhatItWrites) {
  at::Tensor param = at::ones({4});
  at::Tensor own = at::ones({4}) * 2;
  std::vector<NamedTensor> ts{{"shared", param.detach(), {}, true}, {"own", own, {}, true}};
  own.reset();  // only the NamedTensor holds it now
  const int64_t cloned = own_tensors(ts);
  EXPECT_EQ(cloned, 16);
  param.add_(1);  // training goes on: the snapshot must not see it
  EXPECT_EQ(ts[0].tensor[0].item<float>(), 1.0f);
  EXPECT_EQ(ts[1].tensor[0].item<float>(), 2.0f);
}
