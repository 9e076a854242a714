#pragma once
// The straggler report (Megatron's straggler detection): every log_every
// steps, each rank's time per step spent outside collectives -- its own
// work; a slow rank makes the others wait inside collectives instead, so
// their wall times agree and this does not -- is gathered over the world
// (one small host-side MPI all-gather at log steps, no device sync), and the
// step row gets its min / median / max over the ranks; the slowest rank is
// named when it is more than straggler_threshold above the median.
//
// "Outside collectives" comes from the flight recorder's time inside ops
// (core/flight_recorder.h): with flight_recorder_size 0 it is the wall time,
// the same on every rank. On NCCL an op's time is its enqueue, so a GPU
// rank's wait shows in the next host sync instead (the report then compares
// host time: still naming a rank whose host is slow).
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "meshtrain/core/flight_recorder.h"
#include "meshtrain/dist/comm.h"

namespace meshtrain {

// min / median / max of per-rank seconds and the slowest rank when it is
// more than threshold above the median (-1: none). Pure (tested alone).
struct StragglerStats {
  double min = 0, median = 0, max = 0;
  int slowest = -1;
};
StragglerStats straggler_stats(const std::vector<double>& seconds, double threshold);

class StragglerReport {
 public:
  StragglerReport(double threshold, int64_t log_every);
  // Called on every rank after every step, in order: at steps that are a
  // multiple of log_every (collective over world), the row's fields
  // (step_time_min/median/max, slowest_rank); an empty object otherwise and
  // with one rank.
  nlohmann::json after_step(int64_t step, Communicator& world, FlightRecorder& flight);
  // Time not spent training (evaluation, checkpoints) is not a step's: the
  // next interval starts now.
  void restart(FlightRecorder& flight);

 private:
  double threshold_;
  int64_t log_every_;
  std::chrono::steady_clock::time_point since_;
  int64_t steps_ = 0;
  bool started_ = false;
};

}  // namespace meshtrain
