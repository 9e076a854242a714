// Small pieces of "never lose a run": the watchdog's naming of stuck ranks,
// the run-directory lock, the repair of a half-written metrics.jsonl line,
// and messages that survive a NUL.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/core/fs.h"
#include "meshtrain/core/json_read.h"
#include "meshtrain/core/launch_env.h"
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

TEST(Watchdog, NamesTheHostAndPidOfTheRankBehind) {
  const std::string msg = describe_stuck_ranks(
      {{0, true, 2, "start-up: MPI initialisation", "h1", 10}, {1, true, 1, "start-up", "h2", 4242}});
  EXPECT_NE(msg.find("stuck: rank 1 (stopped in 'start-up') on host h2, pid 4242"), std::string::npos) << msg;
}

// The launcher's variables, read before MPI_Init (the watchdog is armed then).
TEST(LaunchEnv, RankSizeAndJobFromTheLauncher) {
  const char* names[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                         "SLURM_PROCID", "SLURM_NTASKS", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                         "SLURM_JOB_ID", "SLURM_STEP_ID"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
    ::unsetenv(n);
  }
  LaunchEnv e = launch_from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.size, 1);
  EXPECT_EQ(e.job, "");
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_JOB_ID", "77", 1);
  ::setenv("SLURM_STEP_ID", "0", 1);
  e = launch_from_environment();
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.size, 8);
  EXPECT_EQ(e.job, "77.0");
  // OpenMPI's own variables come first.
  ::setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  ::setenv("PMIX_NAMESPACE", "prterun-x-1@1", 1);
  e = launch_from_environment();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.size, 4);
  EXPECT_EQ(e.job, "prterun-x-1@1");
  // A rank outside the world is not believed.
  ::setenv("OMPI_COMM_WORLD_RANK", "4", 1);
  ::unsetenv("SLURM_PROCID");
  e = launch_from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.size, 1);
  for (const char* n : names) ::unsetenv(n);
  for (const auto& [n, v] : saved) ::setenv(n.c_str(), v.c_str(), 1);
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
    ADD_FAILURE() << "MT_CHECK(false, ...) did not throw";
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

// Issue 47: a write past `ulimit -f` killed the process with SIGXFSZ and no
// message; ignored, the write fails with EFBIG and the error says why.
TEST(FileSizeLimit, AWritePastItFailsWithAMessageInsteadOfASignal) {
  const fs::path dir = scratch("fsize");
  const std::string file = (dir / "big").string();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ignore_file_size_signal();
    struct rlimit lim {};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 4096;
    ::setrlimit(RLIMIT_FSIZE, &lim);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const std::string bytes(8192, 'x');
    ssize_t w = ::write(fd, bytes.data(), 4096);  // up to the limit
    w = ::write(fd, bytes.data(), 4096);          // past it
    const std::string why = write_failure(errno);
    ::_exit(w < 0 && errno == EFBIG && why.find("ulimit -f, is 4096 bytes") != std::string::npos ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(write_failure(ENOSPC).find("the disk is full"), std::string::npos);
  fs::remove_all(dir);
}

// Issue 47: files nested ~200,000 deep crashed the process when copied.
TEST(JsonRead, DeepOrDamagedFilesAreRefusedWithTheReason) {
  std::string why;
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_TRUE(try_parse_json_text(deep, &why).is_discarded());
  EXPECT_NE(why.find("more than 64 levels deep"), std::string::npos) << why;
  EXPECT_TRUE(try_parse_json_text("{\"a\": [1, 2", &why).is_discarded());
  EXPECT_NE(why.find("not valid JSON"), std::string::npos) << why;
  const nlohmann::json ok = try_parse_json_text(std::string(64, '[') + std::string(64, ']'), &why);
  EXPECT_FALSE(ok.is_discarded());
  EXPECT_EQ(why, "");
  try {
    parse_json_text("[", "checkpoint file", "/x/manifest.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint file /x/manifest.json cannot be read: not valid JSON"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
