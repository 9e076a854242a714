#pragma once
// A collective that never completes (a peer rank died or hangs) would block
// this rank forever. The watchdog is a thread that aborts the process when the
// rank has not reported progress (beat) for `timeout_seconds`; mpirun then
// tears the whole job down, so every rank exits non-zero within a bounded time
// instead of hanging.
//
// Naming the stuck rank: a rank blocked in a collective looks the same as the
// rank that never reached it, so each rank's watchdog thread writes its
// progress (a count of beats and the current phase) to
// heartbeat_dir/rank_NNNNN whenever it changes. Every rank beats the same
// sequence of phases, so on a timeout the ranks whose count is behind the
// others' are the ones that stopped; the message names them, their phase,
// host and pid. A record also carries the launch it belongs to (the job id
// mpirun or srun gives every rank), so the files of an earlier run in the same
// run dir are never taken for this one's.
//
// main arms the watchdog before MPI initialisation, so a rank that never joins
// the world (stopped, or stuck in MPI_Init) ends the job like a hung step.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/core/flight_recorder.h"

namespace meshtrain {

// What one rank last reported.
struct RankProgress {
  int rank = 0;
  bool known = false;  // false: no heartbeat from it (yet)
  int64_t beats = 0;
  std::string phase;
  std::string host;  // where it runs (empty: not recorded)
  int64_t pid = 0;
  std::string flight;  // its flight recorder's axes summary (JSON), when it has one
};

// Which ranks fell behind, for the watchdog's message: "rank 3 stopped in
// 'train step 12' while the others went on" or, when no rank is behind, where
// they all are. Pure, so it is tested without hanging anything.
std::string describe_stuck_ranks(const std::vector<RankProgress>& ranks);

class Watchdog {
 public:
  // timeout_seconds <= 0: disabled (no thread). heartbeat_dir empty: no
  // heartbeat files (a single process needs none). job: the launch's id
  // (launch_from_environment().job); records of another job are ignored.
  Watchdog(double timeout_seconds, int rank, int world_size = 1, std::string heartbeat_dir = "",
           std::string job = "");
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Progress: resets the timer and names what this rank is doing now. Every
  // rank must beat the same sequence (the counts are compared across ranks).
  void beat(const std::string& phase);

  // The rank's collective flight recorder (core/flight_recorder.h): beats
  // name its phases, heartbeats carry its axes summary (refreshed at most
  // once a second while ops run), and on a timeout every rank writes it to
  // flight_dir/rank_NNNNN.json and the message says which rank lags in which
  // op (core/flight_compare.h). Before any op runs; the recorder must outlive
  // the watchdog's use of it (detach with nullptr).
  void attach_flight(FlightRecorder* recorder, const std::string& flight_dir);
  // Writes the recorder's file now (a stop, an error); false when none is attached or it failed.
  bool write_flight(const std::string& reason);

 private:
  void run();
  void write_heartbeat(int64_t beats, const std::string& phase, const std::string& flight);
  std::vector<RankProgress> read_heartbeats() const;
  // On a timeout: this rank's flight file, then the others' (waiting a few
  // seconds for them), compared. Empty without a recorder.
  std::string flight_report(const std::vector<RankProgress>& beats);

  double timeout_;
  int rank_;
  int world_size_;
  std::string dir_;
  std::string job_;
  std::string host_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string phase_ = "start-up";
  int64_t beats_ = 0;
  std::chrono::steady_clock::time_point last_;
  bool stop_ = false;
  FlightRecorder* flight_ = nullptr;  // guarded by mu_
  std::string flight_dir_;
  std::thread thread_;
};

}  // namespace meshtrain
