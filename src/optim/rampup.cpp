#include "meshtrain/optim/rampup.h"

#include <algorithm>
#include <cstdint>

#include "meshtrain/core/check.h"

namespace meshtrain {

int64_t global_batch_at(const Config& cfg, int64_t consumed_samples) {
  const int64_t full = cfg.data.train_batch_size;
  const auto& r = cfg.rampup_batch_size;
  if (r.empty()) return full;
  MT_CHECK(r.size() == 3, "rampup_batch_size must be [start, increment, samples], got ", r.size(), " values");
  const int64_t start = r[0], increment = r[1], samples = r[2];
  if (start >= full || increment <= 0) return full;
  const int64_t increments = (full - start) / increment;
  // Megatron keeps this ratio as a float: the steps need not divide evenly.
  const double samples_per_increment = static_cast<double>(samples) / static_cast<double>(increments);
  if (samples_per_increment <= 0) return full;
  const auto done = static_cast<int64_t>(static_cast<double>(consumed_samples) / samples_per_increment);
  return std::min(full, start + done * increment);
}

int64_t round_batch_at(const Config& cfg, int64_t consumed_samples, int64_t k) {
  MT_CHECK(k >= 0 && cfg.grad_step >= 1, "round_batch_at: round ", k, " with grad_step ", cfg.grad_step);
  for (;;) {
    const int64_t batch = global_batch_at(cfg, consumed_samples);
    if (k < cfg.grad_step) return batch;
    // Every round of a step takes the batch of the step's start.
    k -= cfg.grad_step;
    consumed_samples += batch * cfg.grad_step;
  }
}

int64_t seq_len_at(const Config& cfg, int64_t step) {
  const int64_t T = cfg.data.T;
  const auto& w = cfg.seq_len_warmup;
  if (w.total_curriculum_step <= 0) return T;
  const int64_t lo = w.min_difficulty, total = w.total_curriculum_step;
  const int64_t s = std::clamp<int64_t>(step, 0, total);
  // Integer floor of min + (T - min) * s / total: no float round-off at the
  // steps where the length changes.
  int64_t len = (lo * total + (T - lo) * s) / total;
  len -= len % std::max<int64_t>(1, w.difficulty_step);
  return std::max(lo, std::min(T, len));
}

}  // namespace meshtrain
