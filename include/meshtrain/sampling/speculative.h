#pragma once
// Greedy self-speculative decoding with a model's multi-token prediction
// modules (model/mtp.h; DeepSeek-V3 section 2.2's use at inference): one
// forward of the main model over the context and the pending drafts verifies
// the drafts (each accepted while the main model's own greedy choice at the
// position before it equals it), gives the next token after the last accepted
// one, and its hidden states feed the MTP chain that drafts the following D
// tokens. Every kept token is the main model's argmax on the same context as
// generate()'s greedy path without the cache, so the output is theirs token
// for token (drafts are only proposals); with an MoE capacity (capacity_factor
// > 0) a longer forward may drop other tokens, so exactness needs dropless
// routing. Drafts are proposed only while context and drafts fit in T (past T
// each step is a plain greedy step). Single stage, no KV cache; greedy only.
// Not wired to `generate`'s command line yet.
#include <cstdint>
#include <vector>

#include "meshtrain/model/transformer.h"
#include "meshtrain/sampling/generate.h"

namespace meshtrain {

struct SpeculativeStats {
  int64_t drafted = 0;   // drafts proposed
  int64_t accepted = 0;  // of them, kept
  int64_t forwards = 0;  // forwards of the main model
  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0; }
};

// As generate(model, prompts, options) at temperature 0 with use_cache false
// (options.temperature must be 0; use_cache is ignored). stats may be nullptr.
std::vector<std::vector<int32_t>> generate_speculative(Transformer& model,
                                                       const std::vector<std::vector<int32_t>>& prompts,
                                                       const SampleOptions& options, SpeculativeStats* stats);

}  // namespace meshtrain
