#pragma once
// One optimizer step on a Session, as train() and bench run it:
//   StepStats s = train_step(session);   grad_step accumulation rounds through
//                                        the pipeline, gradient sync, the
//                                        step's statistics summed over the mesh
//   apply_update(session, s, lr);        global norm, clipping, NaN skip, AdamW
//   update_score_bias(session, s);       MoE auxiliary-loss-free balancing
//   s.start_read();                      the step's one device-to-host copy, enqueued
//   ... the next step is enqueued ...
//   s.read();                            waits for that copy only
#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/train/session.h"

namespace meshtrain {

struct RoundSums;

// Step statistics summed over the whole mesh (identical on every rank). The
// sums stay on the device; start_read(), at the end of the step, enqueues
// their one copy to the host (with the gradient norm) and read() waits for
// that copy alone. So a step is read while the next one runs: on a GPU the
// copy sits in the stream behind this step's work, not behind the next
// step's, and the host keeps the device fed.
struct StepStats {
  // The device sums, by name: fp64, summed over dp and pp (tp ranks hold the
  // same values and are counted once).
  struct Sums {
    at::Tensor ce;            // [1] sum of token cross-entropies
    at::Tensor aux;           // [1] sum over sequences of the aux loss (all MoE layers)
    at::Tensor z;             // [1] router z-loss, likewise
    at::Tensor dropped;       // [1] MoE token-assignments dropped (capacity)
    at::Tensor assigned;      // [1] MoE token-assignments made
    // [n_layers + mtp_depth, n_experts] tokens per expert (zero rows: dense
    // layers; row n_layers + j: multi-token prediction module j); [0, 0] dense models
    at::Tensor expert_tokens;
    at::Tensor mtp;           // [mtp_depth] sum of each multi-token prediction depth's token losses
    // The fields in one fixed order (the all-reduce and the read pack them).
    std::vector<at::Tensor*> fields() { return {&ce, &aux, &z, &dropped, &assigned, &expert_tokens, &mtp}; }
  } sums;
  at::Tensor grad_norm_t;  // 0-dim fp64 (apply_update)

  // Known on the host when the step is built.
  double tokens = 0;                 // tokens of the step (every one reaches the loss on some rank)
  // pp > 1: the most time any rank spent blocked on a pipeline neighbour,
  // found by read() (a host all-reduce over every rank, which all reach in
  // their read of the same step; on CUDA, events the read has waited for).
  std::function<double()> pipeline_wait;
  // Zero-bubble schedules: seconds in forward, B and W passes summed over
  // every rank (read() again; the same host all-reduce point).
  std::function<std::array<double, 3>()> pipeline_passes;
  int64_t batch_size = 0;            // sequences per accumulation round (rampup_batch_size)
  int64_t seq_len = 0;               // tokens per sequence (seq_len_warmup)

  // Filled by read().
  double loss = 0;       // mean cross-entropy over the step's tokens
  double aux_loss = 0;   // mean per-sequence aux loss (sum over MoE layers)
  double z_loss = 0;
  std::vector<double> mtp_loss;  // per depth: its loss (1/T) sum of token losses, mean over sequences
  double dropped_fraction = 0;
  // Per MoE layer (global order, the MoE multi-token prediction modules'
  // last), per expert.
  std::vector<std::vector<double>> expert_fraction;
  double grad_norm = 0;  // global gradient norm before clipping (after apply_update)
  double pipeline_wait_seconds = 0;
  std::array<double, 3> pipeline_pass_seconds{};  // zero but under zb-h1 / zbv
  bool read_done = false;

  // Packs the sums and the norm and starts their copy to the host: into
  // pinned memory, non-blocking, an event recorded behind it on a GPU; at
  // once on the CPU and meta. What read() returns is what the sums hold now.
  // Call it once the step's work is enqueued (after apply_update and
  // update_score_bias) and before the next step's. Idempotent.
  void start_read();
  // Whether the copy has landed (read() would not wait). True on the CPU.
  bool landed() const;
  // Fills the values above from the copy, starting it if start_read() was
  // not called; waits for the copy's event only. Idempotent.
  void read();

 private:
  at::Tensor host_;                      // the packed values on the host (pinned on a GPU)
  std::shared_ptr<c10::Event> copied_;  // recorded behind the copy (GPU only)
};

// Sums a step's round sums over the mesh into named statistics (device side).
StepStats reduce_stats(Session& s, const RoundSums& sums, double global_tokens, int64_t seq_len);

// A step's batches, one per accumulation round, on the device: what the host
// prepares before the device's share of the step (a captured graph's inputs,
// train/step_graph.h).
struct StepBatches {
  std::vector<at::Tensor> inputs, targets;  // [batch / dp, seq_len] int64 on the device, per round
  std::vector<at::Tensor> host_inputs;      // the same inputs on the host (token layouts), or undefined
  int64_t batch = 0;                        // sequences per round (rampup_batch_size)
  int64_t seq_len = 0;                      // tokens per sequence (seq_len_warmup)
};

// Where every step starts, before its batches are read: the watchdog's beat
// (and the tests' step hooks).
void begin_step(Session& s);
// The next step's batches from the session's prefetcher (synthetic on the
// meta device), at the step's shape; advances progress().consumed_samples.
StepBatches next_step_batches(Session& s);
// The forward and backward passes of every round of b, the gradients
// synchronised, the statistics summed over the mesh: device work only.
StepStats run_step(Session& s, const StepBatches& b);
// One step's passes on the next batches: begin_step, then
// run_step(s, next_step_batches(s)).
// Advances progress().consumed_samples, not the step.
StepStats train_step(Session& s);
// After train_step: global grad norm, clipping, optimizer update with
// learning rate lr, all on the device: a non-finite loss or norm skips the
// update there (nan_policy is applied when the step is read). Sets
// st.grad_norm_t; reads nothing.
void apply_update(Session& s, StepStats& st, const LearningRate& lr);
// DeepSeek-V3's auxiliary-loss-free balancing (router_bias_update_rate); st read.
void update_score_bias(Session& s, const StepStats& st);

}  // namespace meshtrain
