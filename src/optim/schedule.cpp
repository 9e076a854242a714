#include "meshtrain/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace meshtrain {

double learning_rate(const LrConfig& lr, int64_t step) {
  if (step < lr.warmup_steps)
    return lr.min_lr + (lr.max_lr - lr.min_lr) * static_cast<double>(step) / static_cast<double>(lr.warmup_steps);
  const int64_t decay = lr.end_steps - lr.warmup_steps;
  if (decay <= 0 || step >= lr.end_steps) return step >= lr.end_steps && decay > 0 ? lr.end_lr : lr.max_lr;
  const double progress = static_cast<double>(step - lr.warmup_steps) / static_cast<double>(decay);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * std::clamp(progress, 0.0, 1.0)));
  return lr.end_lr + (lr.max_lr - lr.end_lr) * cosine;
}

}  // namespace meshtrain
