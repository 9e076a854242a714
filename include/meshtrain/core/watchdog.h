#pragma once
// A collective that never completes (a peer rank died or hangs) would block
// this rank forever. The watchdog is a thread that aborts the process when the
// trainer has not reported progress for `timeout_seconds`, after logging which
// phase was stuck; mpirun then tears the whole job down, so every rank exits
// non-zero within a bounded time instead of hanging.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace meshtrain {

class Watchdog {
 public:
  // timeout_seconds <= 0: disabled (no thread).
  Watchdog(double timeout_seconds, int rank);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Progress: resets the timer and names what this rank is doing now.
  void beat(const std::string& phase);

 private:
  void run();

  double timeout_;
  int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string phase_ = "start-up";
  std::chrono::steady_clock::time_point last_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace meshtrain
