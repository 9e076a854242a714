#pragma once
// Autoregressive sampling from a single-stage Transformer (no pipeline; tensor
// parallelism is fine: every tp rank samples the same token from the same seed).
//
// Context: at most T tokens are visible. Without the cache each step re-runs
// the last min(len, T) tokens. With the cache the prompt's last T tokens are
// prefilled and each new token is decoded on top; when the cache is full it is
// restarted from the last T/2 tokens (so past T tokens the two paths see
// different contexts; within T they compute the same logits).
#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/model/decode_step.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

// The model gave NaN or infinite logits (its weights hold NaN/inf): thrown
// alike on every rank (the last pipeline stage shares the verdict), so callers
// may catch it without leaving a rank behind in a collective.
class NonFiniteLogits : public Error {
 public:
  using Error::Error;
};

struct SampleOptions {
  int64_t max_tokens = 32;   // new tokens per prompt
  int64_t top_k = 0;         // 0: the full vocabulary
  double temperature = 1.0;  // 0: greedy (argmax)
  bool use_cache = true;
  uint64_t seed = 0;         // sampling generator (CPU), so runs repeat exactly
  // > 0: only ids below it are drawn. A model's vocabulary is often padded
  // past the tokenizer's (GPT-2: 50304 for 50257 tokens, a multiple of 64);
  // the padding ids decode to nothing.
  int64_t vocab_limit = 0;
  // >= 0: a prompt's sample ends when this token is drawn (the tokenizer's
  // end-of-text); the token itself is not returned. Every rank draws the same
  // token (share()), so every rank stops at the same step.
  int32_t stop_token = -1;
  // The first min_tokens new tokens never are the stop token (it is left out
  // of their draw), so a sample shows text even where the model would end it
  // at once (Hugging Face's min_new_tokens).
  int64_t min_tokens = 0;
  // Called before each new token; throws to stop early (a signal, see
  // core/stop_signal.h). Every rank must call it alike: it may be collective.
  std::function<void()> check_stop;
};

// The distribution a new token is drawn from: logits [..., V] (any device
// and dtype) -> probabilities [..., V'] fp32 on the CPU over the first V' =
// min(V, vocab_limit) ids, the stop token's 0 while !allow_stop; softmax of
// logits / temperature over the top_k, or at temperature 0 one-hot at the
// argmax. Undefined when those logits are not all finite. Plain sampling and
// speculative sampling (sampling/speculative_rule.h) both draw from it.
at::Tensor token_distribution(at::Tensor logits, const SampleOptions& o, bool allow_stop);

// Returns, per prompt, only the generated tokens (max_tokens of them, fewer
// when stop_token ends it). Prompts
// must be non-empty and may have different lengths. Runs in eval mode under
// NoGradGuard; the model's training flag is restored afterwards.
std::vector<std::vector<int32_t>> generate(Transformer& model, const std::vector<std::vector<int32_t>>& prompts,
                                           const SampleOptions& options);

// The same loop over any way of running the model (one decoding step,
// model/decode_step.h; a pipeline's is in parallel/pipeline_generate.h).
std::vector<std::vector<int32_t>> generate(const ModelConfig& cfg, const at::Device& device, const ForwardFn& forward,
                                           const ShareFn& share, const std::vector<std::vector<int32_t>>& prompts,
                                           const SampleOptions& options);

}  // namespace meshtrain
