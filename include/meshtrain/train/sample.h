#pragma once
// A sample from a session's model: inference_config.prompt continued by
// inference_config.max_tokens tokens (ending at end-of-text unless
// inference_config.stop_at_eot is false), on any mesh (train/generate.h for
// one stage, parallel/pipeline_generate.h across stages).
#include <string>

#include "meshtrain/train/session.h"

namespace meshtrain {

// prompt + sample, printing nothing ("" with a warning when the data has no
// tokenizer, or under sequence parallelism). Collective.
std::string sample(Session& s);

}  // namespace meshtrain
