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
  // Called on every rank after every step, in order, with the step's own
  // time as the loop logs it (from where the step before it ended to where
  // its work did): at steps that are a multiple of log_every (collective over
  // world), the row's fields (step_time_min/median/max, slowest_rank); an
  // empty object otherwise and with one rank. The steps are measured by
  // their own times, not by the moments this is called: the loop reads a
  // step's statistics right after the next step's issue, except before a
  // checkpoint, where it reads two steps back to back -- an interval between
  // two calls there holds no step, and near-zero times made a healthy run's
  // ranks look 100% apart at every checkpoint.
  nlohmann::json after_step(int64_t step, double step_seconds, Communicator& world, FlightRecorder& flight);
  // Time not spent training (evaluation, checkpoints) is not a step's: its
  // collectives are not counted against the next steps.
  void restart(FlightRecorder& flight);

 private:
  double threshold_;
  int64_t log_every_;
  double wall_ = 0;  // the steps' own seconds since the last report
  int64_t steps_ = 0;
  bool started_ = false;
};

}  // namespace meshtrain
