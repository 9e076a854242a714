#include "meshtrain/core/watchdog.h"

#include <cstdlib>
#include <iostream>

#include "meshtrain/core/log.h"

namespace meshtrain {

Watchdog::Watchdog(double timeout_seconds, int rank)
    : timeout_(timeout_seconds), rank_(rank), last_(std::chrono::steady_clock::now()) {
  if (timeout_ > 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::beat(const std::string& phase) {
  if (timeout_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  last_ = std::chrono::steady_clock::now();
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto deadline = last_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(timeout_));
    if (std::chrono::steady_clock::now() >= deadline) {
      const std::string msg = "watchdog: rank " + std::to_string(rank_) + " made no progress for " +
                              std::to_string(static_cast<int>(timeout_)) + " s in '" + phase_ +
                              "': a peer rank is dead or stuck in a collective (watchdog_seconds); aborting";
      spdlog::error("{}", msg);
      std::cerr << msg << std::endl;
      // Not a normal process shutdown: other threads may hold locks; abort() is
      // async-safe enough, and mpirun turns one rank's death into the end of the job.
      std::abort();
    }
    cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(1)));
  }
}

}  // namespace meshtrain
