#pragma once
// Validation loss of a session's model: the mean cross-entropy over
// eval_steps batches of the validation data, the same batches every time.
#include "meshtrain/train/session.h"

namespace meshtrain {

// Identical on every rank; NaN when eval_steps is 0. Collective. The
// validation loader's position is left as it was (also when a stop throws).
double evaluate(Session& s);

}  // namespace meshtrain
