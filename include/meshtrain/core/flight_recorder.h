#pragma once
// The collective flight recorder (torchtitan's NCCL flight recorder, for every
// backend): each rank keeps its last N collectives and point-to-point ops in
// a ring -- a sequence number per mesh axis, the op, the peer, bytes, dtype,
// start and end time, the step and the phase. Ranks of one axis group issue
// the same ops in the same order, so comparing their sequence numbers says
// which rank lags and in which op it is stuck (core/flight_compare.h). The
// Communicator reports to it (dist/comm.h, FlightScope in every backend op);
// the watchdog, a stop and an error write it to run_dir/flight/rank_NNNNN.json.
//
// Cost: one uncontended mutex and two clock reads per op (measured in
// tests/unit/flight_test.cpp). Ops come from the training thread and
// autograd's backward thread, never two at once; the mutex is for the
// watchdog thread that reads the ring while they write.
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace meshtrain {

struct FlightEntry {
  int64_t seq = 0;              // per axis, from 1
  const char* op = "";          // static strings: "all_reduce", "send", ...
  const char* dtype = "";
  int axis = 0;                 // index into FlightRecorder::axes()
  int peer = -1;                // the other rank of a send/recv (group rank), the root of a gather/broadcast
  int64_t bytes = 0;
  int64_t start_ns = 0, end_ns = 0;  // steady clock; end 0: still in it
  int64_t step = 0;
  int64_t phase = 0;            // serial of the phase it ran in (FlightRecorder::phase_name)
};

// One mesh axis as this rank sees it.
struct FlightAxis {
  std::string name;  // "dp", "pp", "tp", "ep", "expert_dp", "world"
  int group = 0;     // which group of that axis (ranks of one group compare)
  int rank = 0, size = 1;
  int64_t started = 0;  // ops entered so far (the last sequence number)
  int64_t ended = 0;    // of which completed
};

class FlightRecorder {
 public:
  // capacity 0: records nothing (every call returns at once).
  FlightRecorder(int64_t capacity, int rank);

  bool enabled() const { return capacity_ > 0; }
  int rank() const { return rank_; }
  // Registers an axis (at mesh construction); returns its index.
  int add_axis(const std::string& name, int group, int rank, int size);

  // Opens a record; returns its token for end(). -1 when disabled.
  int64_t begin(int axis, const char* op, const char* dtype, int peer, int64_t bytes);
  void end(int64_t token);

  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  void set_phase(const std::string& phase);

  // Seconds spent inside ops not taken yet (the straggler report's
  // "waiting", train/straggler.h), and forgets them.
  double take_op_seconds();
  // The same for the ops of steps <= step only (set_step's number when each
  // op began): the training loop issues step n + 1 before it reads step n,
  // so the ops of a step are told apart from the next one's by their step.
  double take_op_seconds_through(int64_t step);

  // The whole state (axes, phases, the ring oldest first) as written to
  // run_dir/flight/rank_NNNNN.json; reason: why it was written.
  nlohmann::json to_json(const std::string& reason) const;
  // Per axis: name, group, started, ended and the last op (for heartbeats).
  nlohmann::json axes_json() const;
  // Writes to_json(reason) to dir/rank_NNNNN.json (atomically); false when it could not.
  bool write(const std::string& dir, const std::string& reason) const;
  // Ops entered so far on every axis (changes whenever an op starts or ends).
  int64_t changes() const { return changes_.load(std::memory_order_relaxed); }

 private:
  int64_t capacity_;
  int rank_;
  mutable std::mutex mu_;
  std::vector<FlightEntry> ring_;
  int64_t next_ = 0;  // records ever begun; slot next_ % capacity_
  std::vector<FlightAxis> axes_;
  std::vector<std::string> phases_;  // ring of the last kPhases phase names
  int64_t phase_serial_ = 0;
  std::map<int64_t, int64_t> op_ns_;  // step -> ns inside its ops, not taken yet
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> changes_{0};
};

// Opens a record for the lifetime of an op (a Communicator method); nothing
// when the recorder is null or disabled.
class FlightScope {
 public:
  FlightScope(FlightRecorder* r, int axis, const char* op, const char* dtype, int peer, int64_t bytes)
      : r_(r), token_(r ? r->begin(axis, op, dtype, peer, bytes) : -1) {}
  ~FlightScope() {
    if (token_ >= 0) r_->end(token_);
  }
  FlightScope(const FlightScope&) = delete;
  FlightScope& operator=(const FlightScope&) = delete;

 private:
  FlightRecorder* r_;
  int64_t token_;
};

// rank_00003.json
std::string flight_file_name(int rank);

}  // namespace meshtrain
