#pragma once
// Speculative sampling's acceptance rule (Leviathan et al. 2023, "Fast
// Inference from Transformers via Speculative Decoding"; Chen et al. 2023,
// "Accelerating Large Language Model Decoding with Speculative Sampling"),
// apart from any model so it can be tested on hand-made distributions.
//
// Drafts d_1..d_n were drawn one after another, d_k from q_k (which may depend
// on the drafts before it). The main model's distributions p_k at the same
// positions (p_k conditioned on d_1..d_{k-1}) decide: d_k is kept with
// probability min(1, p_k(d_k) / q_k(d_k)); at the first rejection the token
// is drawn from normalize(max(0, p_k - q_k)) instead and the later drafts are
// dropped; when every draft is kept one more token is drawn from p_{n+1}.
// The kept drafts and that token are then distributed exactly as n + 1 (or
// fewer) draws from p in turn, whatever q is. At temperature 0 (p and q
// one-hot, sampling/generate.h token_distribution) it keeps a draft exactly
// while it equals p's argmax and draws nothing at random.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace meshtrain {

struct DraftVerdict {
  int64_t accepted = 0;  // drafts kept: d_1..d_accepted
  int64_t next = 0;      // the token after them
};

// p [n + 1, V]: the main model's distribution before each draft and after the
// last; q [n, V]: the distribution each draft was drawn from (q_k(d_k) > 0);
// drafts: the n ids. gen: a CPU generator (every draw comes from it, so a
// seed repeats the verdicts).
DraftVerdict verify_drafts(const at::Tensor& p, const at::Tensor& q, const std::vector<int64_t>& drafts,
                           at::Generator& gen);

// One id drawn from the weights w [V] (>= 0, not all 0; any scale) with gen:
// an id of weight 0 is never drawn. The drafts are drawn with it too.
int64_t draw(const at::Tensor& w, at::Generator& gen);

}  // namespace meshtrain
