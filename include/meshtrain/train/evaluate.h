#pragma once
// Validation loss of a session's model: the mean cross-entropy over
// eval_steps batches of the validation data, the same batches every time,
// and the multi-token prediction modules' losses on them.
#include <vector>

#include "meshtrain/train/session.h"

namespace meshtrain {

struct Evaluation {
  double loss = 0;  // mean cross-entropy over the batches' tokens
  // Per multi-token prediction depth k = 1..D (model_config.mtp_depth): the
  // masked sum of its token losses divided by the batches' tokens, as
  // training's mtp_loss (StepStats::mtp_loss); empty without the modules.
  std::vector<double> mtp_loss;
};

// Identical on every rank; NaN losses when eval_steps is 0. Collective. The
// validation loader's position is left as it was (also when a stop throws).
Evaluation evaluate(Session& s);

}  // namespace meshtrain
