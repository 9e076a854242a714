#pragma once
// One optimizer step on a Session, as train() and bench run it:
//   StepStats s = train_step(session);   grad_step accumulation rounds through
//                                        the pipeline, gradient sync, the
//                                        step's statistics summed over the mesh
//   apply_update(session, s, lr);        global norm, clipping, NaN skip, AdamW
//   s.read();                            the step's one device-to-host read
//   update_score_bias(session, s);       MoE auxiliary-loss-free balancing
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/train/session.h"

namespace meshtrain {

struct RoundSums;

// Step statistics summed over the whole mesh (identical on every rank). The
// sums stay on the device until read(), which brings them and the gradient
// norm to the host in one copy, when the step is logged.
struct StepStats {
  // The device sums, by name: fp64, summed over dp and pp (tp ranks hold the
  // same values and are counted once).
  struct Sums {
    at::Tensor ce;            // [1] sum of token cross-entropies
    at::Tensor aux;           // [1] sum over sequences of the aux loss (all MoE layers)
    at::Tensor z;             // [1] router z-loss, likewise
    at::Tensor dropped;       // [1] MoE token-assignments dropped (capacity)
    at::Tensor assigned;      // [1] MoE token-assignments made
    at::Tensor expert_tokens; // [n_layers, n_experts] tokens per expert (zero rows: dense layers); [0, 0] dense models
    // The fields in one fixed order (the all-reduce and the read pack them).
    std::vector<at::Tensor*> fields() { return {&ce, &aux, &z, &dropped, &assigned, &expert_tokens}; }
  } sums;
  at::Tensor grad_norm_t;  // 0-dim fp64 (apply_update)

  // Known on the host when the step is built.
  double tokens = 0;                 // tokens of the step (every one reaches the loss on some rank)
  // pp > 1: the most time any rank spent blocked on a pipeline neighbour,
  // found by read() (a host all-reduce over every rank, which all reach in
  // their read of the same step; on CUDA, events the read has waited for).
  std::function<double()> pipeline_wait;
  int64_t batch_size = 0;            // sequences per accumulation round (rampup_batch_size)
  int64_t seq_len = 0;               // tokens per sequence (seq_len_warmup)

  // Filled by read().
  double loss = 0;       // mean cross-entropy over the step's tokens
  double aux_loss = 0;   // mean per-sequence aux loss (sum over MoE layers)
  double z_loss = 0;
  double dropped_fraction = 0;
  std::vector<std::vector<double>> expert_fraction;  // per MoE layer (global order), per expert
  double grad_norm = 0;  // global gradient norm before clipping (after apply_update)
  double pipeline_wait_seconds = 0;
  bool read_done = false;
  // Fills the values above from the device sums (one host read); idempotent.
  void read();
};

// Sums a step's round sums over the mesh into named statistics (device side).
StepStats reduce_stats(Session& s, const RoundSums& sums, double global_tokens, int64_t seq_len);

// One step's forward and backward passes (grad_step rounds), the gradients
// synchronised; the batch comes from the session's prefetcher (synthetic on
// the meta device). Advances progress().consumed_samples, not the step.
StepStats train_step(Session& s);
// After train_step: global grad norm, clipping, optimizer update with
// learning rate lr, all on the device: a non-finite loss or norm skips the
// update there (nan_policy is applied when the step is read). Sets
// st.grad_norm_t; reads nothing.
void apply_update(Session& s, StepStats& st, double lr);
// DeepSeek-V3's auxiliary-loss-free balancing (router_bias_update_rate); st read.
void update_score_bias(Session& s, const StepStats& st);

}  // namespace meshtrain
