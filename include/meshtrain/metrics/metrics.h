#pragma once
// Where training numbers go: run_dir/metrics.jsonl (one JSON object per line, the
// fields in docs/monitoring.md), the same scalars as TensorBoard events in
// run_dir/tb/, and the console line a person watches.
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/metrics/tensorboard.h"

namespace meshtrain {

// Where a run starts, so that metrics.jsonl keeps one row per step: the rows
// an earlier attempt logged after the checkpoint a run resumes from are
// trained (and logged) again, and a run started over is another history.
struct MetricsStart {
  // >= 0: the run continues from this step; rows with a larger step are
  // dropped (the file is rewritten beside it and renamed over it). -1: keep all.
  int64_t step = -1;
  // The run starts over (--fresh): an existing metrics.jsonl is renamed
  // metrics.jsonl.superseded (.1, .2, ... when taken) and a new one begun.
  bool fresh = false;
};

class MetricsLogger {
 public:
  // Every rank constructs one; only the rank passing enabled=true (rank 0)
  // touches the disk, so callers need no rank checks around log(). With
  // TensorBoard, a SessionLog START event at step start.step + 1 opens the new
  // event file: TensorBoard then drops the older files' events from that step
  // on (its purge of orphaned data after a restart).
  MetricsLogger(const std::string& run_dir, bool enabled, bool tensorboard = true, MetricsStart start = {});

  // Appends `row` (a JSON object with an integer "step") as one line, flushed
  // so a crash loses nothing already logged; each number in it other than
  // "step" becomes a TensorBoard scalar named by its key (array elements and
  // nested objects as "key/index" and "key/sub").
  void log(const nlohmann::json& row);

  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  std::string jsonl_path_;
  std::ofstream jsonl_;
  std::unique_ptr<TensorBoardWriter> tb_;
};

// "Step 100, Loss: 4.1234, Eval Loss: 4.2345, lr: 3.00e-04, tk/s: 12,345.67"
// (Jaxformer's line), showing only the keys present in `row`.
std::string format_step_line(const nlohmann::json& row);

// Time left, from the pace since this process started (a resumed run starts at
// its checkpoint's step, so its first steps do not count as instantaneous).
class Progress {
 public:
  Progress(int64_t start_step, int64_t total_steps);

  // "ETA 1m23s"; "ETA ?" until a step has been timed.
  std::string eta(int64_t step, double elapsed_seconds) const;

  // Whether to print it: a terminal, not a log file or a pipe.
  static bool stderr_is_terminal();

 private:
  int64_t start_step_;
  int64_t total_steps_;
};

// 83 -> "1m23s", 7500 -> "2h05m", 200000 -> "2d07h".
std::string format_duration(double seconds);

}  // namespace meshtrain
