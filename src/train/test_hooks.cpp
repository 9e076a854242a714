#include "meshtrain/train/test_hooks.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <thread>

#include "meshtrain/core/check.h"
#include "meshtrain/core/launch_env.h"
#include "meshtrain/core/log.h"

namespace meshtrain {

namespace {

int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  MT_CHECK(*end == '\0' && x >= 0, name, "='", v, "' must be a non-negative integer");
  return x;
}

// "A:B" -> (A, B), both non-negative numbers.
std::pair<int64_t, double> env_pair(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return {-1, 0};
  char* end = nullptr;
  const long long a = std::strtoll(v, &end, 10);
  MT_CHECK(*end == ':', name, "='", v, "' must be A:B");
  const double b = std::strtod(end + 1, &end);
  MT_CHECK(*end == '\0' && a >= 0 && b >= 0, name, "='", v, "' must be A:B, two non-negative numbers");
  return {a, b};
}

}  // namespace

TestHooks TestHooks::from_environment() {
  TestHooks h;
  // "K" or "K-L" (steps K to L).
  if (const char* v = std::getenv("MESHTRAIN_TEST_NAN_AT_STEP"); v && *v) {
    char* end = nullptr;
    h.nan_from_ = std::strtoll(v, &end, 10);
    h.nan_to_ = *end == '-' ? std::strtoll(end + 1, &end, 10) : h.nan_from_;
    MT_CHECK(*end == '\0' && h.nan_from_ >= 0 && h.nan_to_ >= h.nan_from_, "MESHTRAIN_TEST_NAN_AT_STEP='", v,
             "' must be K or K-L (steps, K <= L)");
  }
  h.nan_weights_at_ = env_int("MESHTRAIN_TEST_NAN_WEIGHTS_AT_STEP");
  h.host_read_at_ = env_int("MESHTRAIN_TEST_HOST_READ_AT_STEP");
  h.alloc_at_ = env_int("MESHTRAIN_TEST_ALLOC_AT_STEP");
  const char* stall = std::getenv("MESHTRAIN_TEST_STALL_AT_STEP");
  h.stall_before_init_ = stall && std::string(stall) == "init";
  if (!h.stall_before_init_) h.stall_at_step_ = env_int("MESHTRAIN_TEST_STALL_AT_STEP");
  if (const char* ranks = std::getenv("MESHTRAIN_TEST_STALL_RANKS")) {
    std::stringstream ss(ranks);
    for (std::string r; std::getline(ss, r, ',');)
      if (!r.empty()) h.stall_ranks_.push_back(std::atoi(r.c_str()));
  }
  h.launch_rank_ = launch_from_environment().rank;
  h.sigstop_at_step_ = env_int("MESHTRAIN_TEST_SIGSTOP_AT_STEP");
  h.sigstop_hold_ = env_int("MESHTRAIN_TEST_SIGSTOP_HOLD") > 0;
  const auto slow = env_pair("MESHTRAIN_TEST_SLOW_RANK");
  h.slow_rank_ = static_cast<int>(slow.first);
  h.slow_ms_ = static_cast<int64_t>(slow.second);
  std::tie(h.ckpt_delay_step_, h.ckpt_delay_seconds_) = env_pair("MESHTRAIN_TEST_CKPT_WRITE_DELAY");
  return h;
}

void TestHooks::after_backward(int64_t step, ParallelModel& pm) const {
  if (step == sigstop_at_step_ &&
      std::find(stall_ranks_.begin(), stall_ranks_.end(), launch_rank_) != stall_ranks_.end()) {
    spdlog::warn("test hook: rank {} stops (SIGSTOP) after the backward pass of step {}", launch_rank_, step);
    // Its watchdog thread rewrites the heartbeat (with the flight summary) within a second.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    std::raise(SIGSTOP);
    // Without the hold, a stop that SIGCONT ends (a frozen moment) lets the
    // rank go on. With it, the SIGCONT of mpirun's kill sequence must not let
    // the rank into the op the others wait in: the flight records would then
    // show no divergence.
    while (sigstop_hold_) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (step == host_read_at_)
    for (auto& p : pm.params)
      if (p.tensor.grad().defined()) {
        spdlog::warn("test hook: the host reads a gradient after the backward pass of step {}", step);
        (void)p.tensor.grad().sum().item<double>();
        break;
      }
  if (step == alloc_at_ && !pm.params.empty()) {
    spdlog::warn("test hook: a buffer is allocated after the backward pass of step {}", step);
    (void)at::empty({4096}, pm.params.front().tensor.options());
  }
  if (step < nan_from_ || step > nan_to_) return;
  at::NoGradGuard ng;
  for (auto& p : pm.params)
    if (p.tensor.grad().defined()) p.tensor.grad().fill_(std::nan(""));
}

void TestHooks::after_update(int64_t step, ParallelModel& pm) const {
  if (step != nan_weights_at_) return;
  at::NoGradGuard ng;
  for (auto& p : pm.params) p.tensor.fill_(std::nan(""));
}

void TestHooks::before_step(int64_t step, int rank) const {
  // Slow steps without using the CPU: the SLURM tests need a run that outlasts
  // a time limit's warning.
  if (const int64_t ms = env_int("MESHTRAIN_TEST_STEP_SLEEP_MS"); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  if (rank == slow_rank_ && slow_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
  if (step != stall_at_step_ || std::find(stall_ranks_.begin(), stall_ranks_.end(), rank) == stall_ranks_.end())
    return;
  spdlog::warn("test hook: rank {} stalls before step {}", rank, step);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void TestHooks::before_mpi_init(int rank) const {
  if (!stall_before_init_ || std::find(stall_ranks_.begin(), stall_ranks_.end(), rank) == stall_ranks_.end()) return;
  // Stopped, as by a debugger or a frozen node: its own watchdog thread stops
  // too, so only the other ranks can name it.
  spdlog::warn("test hook: rank {} stops (SIGSTOP) before MPI initialisation", rank);
  // Its watchdog thread writes its first heartbeat (host, pid) as it starts.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::raise(SIGSTOP);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace meshtrain
