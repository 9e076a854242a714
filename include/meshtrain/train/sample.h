#pragma once
// A sample from a session's model: inference_config.prompt continued by
// inference_config.max_tokens tokens (ending at end-of-text unless
// inference_config.stop_at_eot is false), on any mesh (train/generate.h for
// one stage, parallel/pipeline_generate.h across stages).
#include <string>

#include "meshtrain/train/session.h"

namespace meshtrain {

// Why cfg's run cannot sample, "" when it can: the data has no tokenizer to
// encode the prompt and decode the sample (data_config.data_dir's
// tokenizer.json), or sequence parallelism over tp > 1. The end-of-run
// sample of train is skipped with it as a warning; `generate` is refused.
std::string sample_unavailable(const Config& cfg);

// prompt + sample, printing nothing ("" with a warning when
// sample_unavailable says why). Collective.
std::string sample(Session& s);

}  // namespace meshtrain
