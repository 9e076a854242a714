#pragma once
// One accumulation round cut into microbatches, and what a round adds up:
// shared by the single-stage loop (pipeline.cpp) and the pipeline schedules
// (schedules.cpp), so a batch's route pipeline -> schedules -> pipeline_plan
// never re-enters a file.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

// Sums over the microbatches this rank computed (non-zero on the last stage
// only). The sums are 0-dim fp64 tensors on the model's device, undefined when
// nothing was added: reading them is a device-to-host sync, which a training
// step does once, when it logs (Trainer::train_step packs them).
struct RoundSums {
  at::Tensor ce_sum;        // sum of token cross-entropies
  double tokens = 0;        // tokens counted in ce_sum (known on the host)
  at::Tensor aux_sum;       // sum over sequences of the per-sequence aux loss (all MoE layers)
  at::Tensor z_sum;
  at::Tensor dropped, assigned;                // MoE token-assignments (this rank's layers)
  std::vector<at::Tensor> expert_tokens;       // per local MoE layer: [E] fp64, per expert
  std::vector<at::Tensor> mtp_expert_tokens;   // per multi-token prediction module: likewise (dense: undefined)
  std::vector<at::Tensor> mtp_sum;             // per multi-token prediction depth: sum of its token losses
  int64_t peak_live_microbatches = 0;          // activations held at once (schedule tests)
  // Blocked in pipeline send/recv (bubble measurement): host wall-clock on
  // CPU, CUDA events on GPU (src/parallel/wait_clock.h). One reader per
  // round, called when the step is read: on CUDA the events' times are known
  // only once the stream has passed them, and asking earlier would be a host
  // sync in the middle of the step.
  std::vector<std::function<double()>> waits;
  // Seconds of all rounds so far (on CUDA: waits for their last event).
  double wait_seconds() const;
  // Zero-bubble plans: seconds in forward, B and W passes, read the same
  // way (the measured lengths pipeline_pass_costs asks for).
  std::vector<std::function<std::array<double, 3>()>> passes;
  std::array<double, 3> pass_seconds() const;

  // Adds another round's (or microbatch's) sums; the peak is a maximum.
  RoundSums& operator+=(const RoundSums& o);
};

// The value of a sum (0 when undefined); a device-to-host read.
double sum_value(const at::Tensor& t);

struct RoundSpec {
  double ce_scale = 1.0;    // multiplies the ce sum in the backward loss (1 / global tokens of the step)
  double aux_scale = 0.0;   // multiplies the per-sequence aux sum (alpha / global sequences of the step)
  double z_scale = 0.0;
  double mtp_scale = 0.0;   // multiplies each depth's loss sum (lambda / D / global tokens of the step)
  bool backward = true;     // false: evaluation (no grad)
  // The step's last accumulation round: each chunk's last backward pass arms
  // pm.grad_buckets, so the dp sum of its gradients overlaps with the rest.
  bool final_round = true;
  // A test seam (SessionOptions::backward_thread): every backward pass runs on a
  // thread of its own, as CUDA's autograd engine runs it on its device
  // thread, so CPU tests see what only a forward-thread state would hide.
  bool backward_thread = false;
};

struct Microbatch {
  at::Tensor inputs, targets;
  // The same rows' inputs on the host, where token layouts are built from
  // (undefined where none are).
  at::Tensor host_inputs;
  // Packed documents / context parallelism (parallel/context_parallel.h):
  // inputs and targets are then this cp rank's chunks. Null: plain rows.
  std::shared_ptr<const TokenLayout> layout;
  // model_config.mtp_depth > 0: what each depth reads (model/mtp.h), from
  // the whole sequences (this cp rank's chunks under cp, like inputs).
  MtpTargets mtp;
};

// The round's rows in microbatches of data_config.micro_batch_size, each
// with its rows of host_inputs (when given): one split for both.
std::vector<Microbatch> split_microbatches(const Config& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                                           const at::Tensor& host_inputs = {});
// Adds one microbatch's MoE statistics to the round's sums (on the device);
// aux.expert_tokens[l] is the stage's MoE layer first_moe_layer + l (a later
// chunk of an interleaved stage starts after the earlier chunks' layers);
// aux.mtp_expert_tokens[j] is multi-token prediction module j's.
void accumulate_aux(RoundSums& sums, const ForwardAux& aux, int64_t sequences, int64_t first_moe_layer = 0);
// Adds one microbatch's per-token losses (their sum and count).
void accumulate_losses(RoundSums& sums, const at::Tensor& token_losses);
// Adds one microbatch's multi-token prediction losses, per depth.
void accumulate_mtp(RoundSums& sums, const std::vector<at::Tensor>& mtp_losses);
// Gives each microbatch its multi-token prediction targets (model_config.
// mtp_depth > 0), before any context-parallel split.
void add_mtp_targets(std::vector<Microbatch>& mbs, const Config& cfg);
// torch::autograd::backward(roots, grads) on this thread, or, under
// spec.backward_thread, on a new thread that inherits this one's at::
// ThreadLocalState (grad mode, ...) as the engine's device threads do; its
// exceptions are rethrown here.
void run_backward(const RoundSpec& spec, const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads);
// The scalar whose backward gives this microbatch's share of the step's gradient.
// mtp_losses: per depth (multi-token prediction), weighted by spec.mtp_scale.
at::Tensor stage_loss(const at::Tensor& token_losses, const ForwardAux& aux, int64_t sequences, const RoundSpec& spec,
                      const std::vector<at::Tensor>& mtp_losses = {});

}  // namespace meshtrain
