#pragma once
// What a training step leaves behind: one row in metrics.jsonl (and
// TensorBoard) per step, the console's step line every log_every steps, and
// the MoE router-collapse warning (experts that get no token step after step).
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshtrain/metrics/metrics.h"
#include "meshtrain/train/evaluate.h"
#include "meshtrain/train/step.h"

namespace meshtrain {

class StepLog {
 public:
  // Opens run_dir/metrics.jsonl on rank 0 (rows after start.step dropped,
  // --fresh sets the old file aside: one row per step); start_step: the step
  // training starts from (for the ETA).
  StepLog(const Config& cfg, bool rank0, bool quiet, MetricsStart start);

  // The row of the step just taken (its number: `step`).
  // extra: more fields for the row (the straggler report's).
  void step(int64_t step, const StepStats& s, double lr, double seconds, bool pipeline,
            const nlohmann::json& extra = nlohmann::json::object());
  // A checkpoint row at `step`: checkpoint_blocked_seconds (training time the
  // save cost) and the fields of `fields`.
  void checkpoint(int64_t step, const nlohmann::json& fields);
  // The evaluation row of `step`: val_loss, and val_mtp_loss per depth
  // with multi-token prediction.
  void validation(int64_t step, double train_loss, const Evaluation& val);

 private:
  void warn_starved_experts(const StepStats& s);
  // Zero-bubble schedules: the measured forward : B : W lengths in the row
  // (pipeline_pass_costs), and once a hint when the plans assume others.
  void log_pass_costs(int64_t step, const std::array<double, 3>& seconds, nlohmann::json& row);
  std::string progress_suffix(int64_t step) const;

  const Config& cfg_;
  bool quiet_;
  std::unique_ptr<MetricsLogger> metrics_;
  std::chrono::steady_clock::time_point start_;
  int64_t start_step_;
  std::vector<int64_t> starved_steps_;  // per (MoE layer, expert): consecutive steps with no token
  bool pass_costs_said_ = false;
};

}  // namespace meshtrain
