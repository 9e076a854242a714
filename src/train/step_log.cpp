// What a training step leaves behind (see step_log.h).
#include "meshtrain/train/step_log.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "meshtrain/core/log.h"
#include "meshtrain/parallel/pipeline_plan.h"

namespace meshtrain {

StepLog::StepLog(const Config& cfg, bool rank0, bool quiet, MetricsStart start)
    : cfg_(cfg),
      quiet_(quiet),
      metrics_(std::make_unique<MetricsLogger>(cfg.run_dir(), rank0, /*tensorboard=*/true, start)),
      start_(std::chrono::steady_clock::now()),
      start_step_(std::max<int64_t>(start.step, 0)) {}

void StepLog::step(int64_t step, const StepStats& s, double lr, double seconds, bool pipeline,
                   const nlohmann::json& extra) {
  nlohmann::json row;
  row["step"] = step;
  row["loss"] = s.loss;
  row["lr"] = lr;
  row["grad_norm"] = s.grad_norm;
  row["tokens_per_sec"] = seconds > 0 ? s.tokens / seconds : 0.0;
  if (pipeline && seconds > 0) row["pipeline_bubble"] = s.pipeline_wait_seconds / seconds;
  if (s.pipeline_pass_seconds[0] > 0) log_pass_costs(step, s.pipeline_pass_seconds, row);
  if (!cfg_.rampup_batch_size.empty()) row["batch_size"] = s.batch_size;
  if (cfg_.seq_len_warmup.total_curriculum_step > 0) row["seq_len"] = s.seq_len;
  if (cfg_.model.mtp_depth > 0) row["mtp_loss"] = s.mtp_loss;  // per depth; TensorBoard: mtp_loss/<k - 1>
  if (cfg_.model.ffn == FfnKind::Moe) {
    row["aux_loss"] = s.aux_loss;
    row["loss_cross"] = s.loss;
    row["dropped_fraction"] = s.dropped_fraction;
    if (cfg_.model.router_z_loss > 0) row["z_loss"] = s.z_loss;
    row["expert_load"] = s.expert_fraction;
    // MaxVio (DeepSeek's balance metric): max load / mean load - 1 per MoE layer.
    std::vector<double> max_vio;
    for (const auto& f : s.expert_fraction)
      if (!f.empty()) max_vio.push_back(*std::max_element(f.begin(), f.end()) * static_cast<double>(f.size()) - 1.0);
    row["max_vio"] = max_vio;
    warn_starved_experts(s);
  }
  for (const auto& [k, v] : extra.items()) row[k] = v;
  metrics_->log(row);
  if (!quiet_ && (step % std::max<int64_t>(1, cfg_.log_every) == 0 || step == cfg_.training_steps))
    spdlog::info("{}{}", format_step_line(row), progress_suffix(step));
}

void StepLog::validation(int64_t step, double train_loss, const Evaluation& val) {
  nlohmann::json row = {{"step", step}, {"val_loss", val.loss}};
  // Per depth, as the training rows' mtp_loss; TensorBoard: val_mtp_loss/<k - 1>.
  if (!val.mtp_loss.empty()) row["val_mtp_loss"] = val.mtp_loss;
  metrics_->log(row);
  spdlog::info("Step {}, Loss: {:.4f}, Eval Loss: {:.4f}", step, train_loss, val.loss);
}

void StepLog::checkpoint(int64_t step, const nlohmann::json& fields) {
  nlohmann::json row = {{"step", step}};
  for (const auto& [k, v] : fields.items()) row[k] = v;
  metrics_->log(row);
}

void StepLog::warn_starved_experts(const StepStats& s) {
  // Router collapse shows as experts that receive no token step after step.
  constexpr int64_t kPatience = 50;
  size_t n = 0;
  for (const auto& layer : s.expert_fraction) n += layer.size();
  starved_steps_.resize(n, 0);
  size_t i = 0;
  for (size_t l = 0; l < s.expert_fraction.size(); ++l)
    for (size_t e = 0; e < s.expert_fraction[l].size(); ++e, ++i) {
      starved_steps_[i] = s.expert_fraction[l][e] > 0 ? 0 : starved_steps_[i] + 1;
      if (starved_steps_[i] > 0 && starved_steps_[i] % kPatience == 0)
        spdlog::warn("MoE layer {} expert {} got no tokens for {} steps (router collapse?)", l, e, starved_steps_[i]);
    }
}

void StepLog::log_pass_costs(int64_t step, const std::array<double, 3>& seconds, nlohmann::json& row) {
  const auto rel = [&](size_t i) { return std::round(1000 * seconds[i] / seconds[0]) / 1000; };
  const std::array<double, 3> measured = {1.0, rel(1), rel(2)};
  row["pipeline_pass_costs"] = measured;
  // Once, past the first steps' warm-up: where the plans' lengths are far
  // from the measured ones, say which key makes the plans with these.
  constexpr int64_t kWarmup = 3;
  if (pass_costs_said_ || step < start_step_ + kWarmup) return;
  pass_costs_said_ = true;
  const PassCosts planned = pipeline_pass_costs(cfg_);
  const double b = planned.backward_input / planned.forward, w = planned.backward_weight / planned.forward;
  if (std::abs(measured[1] - b) <= 0.1 * b && std::abs(measured[2] - w) <= 0.1 * w) return;
  spdlog::info("{} passes measured forward : B : W = 1 : {:.2f} : {:.2f}; the plans are made with 1 : {:.2f} : {:.2f}{}"
               " (set pipeline_pass_costs: [1, {:.2f}, {:.2f}] to make them with the measured lengths; `meshtrain "
               "plan` shows the bubble either gives)",
               choice_name(cfg_.pipeline_schedule), measured[1], measured[2], b, w,
               cfg_.pipeline_pass_costs.empty() ? " (the model's FLOPs)" : " (pipeline_pass_costs)", measured[1],
               measured[2]);
}

std::string StepLog::progress_suffix(int64_t step) const {
  // The ETA only helps a person watching a terminal; logs and pipes skip it.
  if (!Progress::stderr_is_terminal()) return {};
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return ", " + Progress(start_step_, cfg_.training_steps).eta(step, elapsed);
}

}  // namespace meshtrain
