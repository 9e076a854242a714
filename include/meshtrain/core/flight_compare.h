#pragma once
// Comparing the flight recorders of every rank (core/flight_recorder.h): the
// ranks of one axis group (e.g. the dp ranks of one (pp, tp) position) issue
// the same ops in the same order, so the first sequence number at which they
// differ -- a rank that never entered op #k while the others wait in it, or
// ranks in different ops at the same number -- is where the job hangs. Pure
// functions on what the ranks wrote, so they are tested without hanging
// anything; the watchdog's message and `meshtrain flight RUN_DIR` use them.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace meshtrain {

// What is known of one rank: its flight file (axes + records), or only the
// axes summary its heartbeat carried (a stopped rank writes no file), or nothing.
struct RankFlight {
  int rank = 0;
  bool known = false;
  std::string source;                                // "flight file" | "heartbeat"
  nlohmann::json axes = nlohmann::json::object();    // FlightRecorder::axes_json()
  nlohmann::json records = nlohmann::json::array();  // FlightRecorder::to_json()["records"], may be empty
  // A record that exists but could not be read (truncated, garbage, not a
  // flight record): the file and why. Nothing is concluded from it.
  std::string problem = "";
};

// Whether j is a flight record as FlightRecorder::to_json writes it: an
// "axes" object of objects and, when present, "records" a list of objects.
// Anything else (a damaged or foreign file) is never compared.
bool is_flight_record(const nlohmann::json& j);

// One sentence for the watchdog: the rank(s) whose sequence number lags on an
// axis and the op the others wait in ("rank 1 never entered dp op #57
// (all_reduce, step 5); ranks 0 wait in it"), or the rank stuck in an older op.
// Empty when no axis shows a lag or a difference.
std::string describe_flight_lag(const std::vector<RankFlight>& ranks);

// The report of `meshtrain flight`: per axis group, the ranks' last sequence
// numbers and the first diverging one, with what each rank did there. It
// says no rank lags only when every rank's record was read.
std::string compare_flights(const std::vector<RankFlight>& ranks);

// Reads run_dir/flight/rank_*.json and, for ranks without one (or whose file
// cannot be read: RankFlight::problem), the flight summary in
// run_dir/heartbeats/rank_* (world_size: how many ranks to look for; <= 0:
// as many as files found).
std::vector<RankFlight> read_flights(const std::string& run_dir, int world_size);

}  // namespace meshtrain
