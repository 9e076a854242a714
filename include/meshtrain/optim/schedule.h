#pragma once
// Learning-rate schedule of the `lr` section, as Jaxformer's
// optax.warmup_cosine_decay_schedule: linear warmup from min_lr to max_lr over
// warmup_steps, then cosine decay to end_lr; end_steps is the total length of
// the schedule, warmup included (optax's decay_steps); end_lr afterwards.
#include <cstdint>

#include "meshtrain/config/config.h"

namespace meshtrain {

double learning_rate(const LrConfig& lr, int64_t step);

}  // namespace meshtrain
