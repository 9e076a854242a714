#include "meshtrain/train/straggler.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "meshtrain/core/log.h"

namespace meshtrain {

StragglerStats straggler_stats(const std::vector<double>& seconds, double threshold) {
  StragglerStats s;
  if (seconds.empty()) return s;
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.min = sorted.front();
  s.max = sorted.back();
  s.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  const auto slowest = std::max_element(seconds.begin(), seconds.end());
  if (n > 1 && *slowest > s.median * (1 + threshold)) s.slowest = static_cast<int>(slowest - seconds.begin());
  return s;
}

StragglerReport::StragglerReport(double threshold, int64_t log_every)
    : threshold_(threshold), log_every_(std::max<int64_t>(1, log_every)) {}

void StragglerReport::restart(FlightRecorder& flight) {
  wall_ = 0;
  steps_ = 0;
  flight.take_op_seconds();
  started_ = true;
}

nlohmann::json StragglerReport::after_step(int64_t step, double step_seconds, Communicator& world,
                                           FlightRecorder& flight) {
  nlohmann::json out = nlohmann::json::object();
  if (world.size() == 1) return out;
  if (!started_) {  // the first step of this process: nothing measured before it
    restart(flight);
    return out;
  }
  ++steps_;
  wall_ += step_seconds;
  if (step % log_every_ != 0) return out;
  // The ops of these steps only: step + 1, issued before this one is read, keeps its own.
  const double busy = std::max(0.0, wall_ - flight.take_op_seconds_through(step)) / static_cast<double>(steps_);
  const at::Tensor all = world.all_gather(at::full({1}, busy, at::kDouble));
  const std::vector<double> seconds(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  const StragglerStats s = straggler_stats(seconds, threshold_);
  out["step_time_min"] = s.min;
  out["step_time_median"] = s.median;
  out["step_time_max"] = s.max;
  if (s.slowest >= 0) {
    out["slowest_rank"] = s.slowest;
    if (world.rank() == 0)
      spdlog::warn("straggler: rank {} took {:.4f} s per step outside collectives over the last {} step(s), the "
                   "median rank {:.4f} s (more than straggler_threshold {} above it)", s.slowest, s.max, steps_,
                   s.median, threshold_);
  }
  wall_ = 0;
  steps_ = 0;
  return out;
}

}  // namespace meshtrain
