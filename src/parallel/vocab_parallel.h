#pragma once
// Vocabulary-parallel embedding, LM head and cross-entropy (Megatron): the
// vocabulary, padded to a multiple of tp, is split into tp contiguous ranges;
// padded rows are zero and padded logits are -inf, so they are never looked up,
// predicted or sampled. Private to parallel/ (tensor_parallel.cpp builds these).
#include <ATen/core/Tensor.h>

#include <memory>

#include "meshtrain/dist/comm.h"
#include "meshtrain/model/layers.h"

namespace meshtrain {

// This rank's slice [start, start + local) of the padded vocabulary, of which
// the first `real` entries are real tokens (the rest is padding).
struct VocabRange {
  int64_t vocab = 0;   // real vocabulary size
  int64_t padded = 0;  // vocab rounded up to a multiple of tp
  int64_t start = 0;
  int64_t local = 0;
  int64_t real = 0;
};
VocabRange vocab_range(int64_t vocab, int64_t tp_size, int64_t tp_rank);

// The rows of the padded [padded, d] table this rank holds: real rows drawn
// from init_normal(seed, name, {vocab, d}), padding zero.
at::Tensor vocab_shard(uint64_t seed, const std::string& name, int64_t d, double std, const VocabRange& r);

// Per-row cross-entropy of targets [N] against the logits h @ weight_local^T
// whose columns are this rank's vocabulary range, without gathering them:
// the row max, the sum of exponentials and the target logit are all-reduced
// over N floats each. h [N, d] is already inside the tp region. Backward:
// this rank's part of dh (summed by the region entry) and its weight rows.
// The GEMMs take their operands in `precision`'s compute dtype.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& h, const at::Tensor& weight_local, const at::Tensor& targets,
                                        Communicator& tp, const VocabRange& r, MixedPrecision& precision);

// factory: the TP factory whose exit_tp (all-reduce, or reduce-scatter along
// the sequence) finishes the lookup; must outlive the layer.
std::shared_ptr<Embedding> make_vocab_parallel_embedding(at::Tensor weight_local, VocabRange r, LayerFactory* factory);
// weight_local: this rank's rows, or undefined to read tied->weight() at every call.
std::shared_ptr<LMHead> make_vocab_parallel_head(at::Tensor weight_local, std::shared_ptr<Embedding> tied,
                                                 VocabRange r, LayerFactory* factory, Communicator* tp);

}  // namespace meshtrain
