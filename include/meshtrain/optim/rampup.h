#pragma once
// BigScience's two warm-ups of the batch shape (pure functions of the config):
//  - batch-size rampup, Megatron's --rampup-batch-size start increment samples:
//    the global batch (data_config.train_batch_size, per accumulation round)
//    starts at `start` and grows by `increment` each time
//    samples / ((train_batch_size - start) / increment) samples have been
//    consumed, until train_batch_size;
//  - sequence-length warmup, DeepSpeed's curriculum "fixed_linear" on seqlen:
//    T at step s = min(T, floor((min + (T - min) * s / total) / step) * step),
//    and never below min.
// The LR schedule stays a function of the step (Megatron's follows consumed
// samples during rampup; ours warms up over steps whatever their size).
#include <cstdint>

#include "meshtrain/config/config.h"

namespace meshtrain {

// Sequences per accumulation round after consumed_samples sequences.
int64_t global_batch_at(const Config& cfg, int64_t consumed_samples);

// Sequences of the k-th accumulation round counted from a step that starts
// after consumed_samples sequences (k = 0: its first round; k = grad_step:
// the first of the next step): what a prefetcher reads one round ahead.
int64_t round_batch_at(const Config& cfg, int64_t consumed_samples, int64_t k);

// Tokens per sequence at (0-based) step `step`.
int64_t seq_len_at(const Config& cfg, int64_t step);

}  // namespace meshtrain
