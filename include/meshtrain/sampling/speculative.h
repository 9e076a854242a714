#pragma once
// Self-speculative decoding and sampling with a model's multi-token
// prediction modules (model/mtp.h; DeepSeek-V3 section 2.2's use at
// inference): the MTP chain drafts up to D tokens, each drawn from its
// module's distribution q_k and fed to the next module; one forward of the
// main model over the new tokens and the drafts gives p at each of them, and
// speculative sampling's rule (sampling/speculative_rule.h) keeps a prefix of
// the drafts and draws the token after it. Each p is the distribution
// generate() draws that new token from (same window of context,
// temperature, top_k, vocab_limit, stop token and min_tokens), so the output
// is distributed exactly as plain sampling's, though not the same tokens for
// the same seed (the draws differ). At temperature 0 every distribution is
// one-hot, a draft is kept exactly while it equals the main model's argmax,
// and the output is plain greedy's token for token (with the cache: as
// generate()'s cached path, restarts past T included; without: as its
// uncached path). With an MoE capacity (capacity_factor > 0) a longer forward
// may drop other tokens, so exactness needs dropless routing. Drafts never
// cross a change of the window generate() gives their tokens: with the cache
// they stop short of each restart (and resume after it); without it they stop
// once the context reaches T (each later step is a plain one).
// With use_cache the main model keeps a KV cache that drops the rejected
// drafts' positions, and each MTP module one that drops the positions where
// it read a draft; without it both run over the window. Single stage only.
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

// As generate(model, prompts, options): the same options, the same
// distribution of outputs (generator seeded from options.seed, so a run
// repeats exactly); check_stop is called before each forward of the main
// model (1 to D + 1 new tokens). stats may be nullptr.
std::vector<std::vector<int32_t>> generate_speculative(Transformer& model,
                                                       const std::vector<std::vector<int32_t>>& prompts,
                                                       const SampleOptions& options, SpeculativeStats* stats);

}  // namespace meshtrain
