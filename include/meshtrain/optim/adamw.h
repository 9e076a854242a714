#pragma once
// AdamW (decoupled weight decay) over a fixed list of parameters. Weight decay
// applies to matrices only (not norms, biases), decided by the caller per
// parameter. State (moments, step) is exposed by name so checkpoints can save
// it with the same shard layout as the parameter it belongs to.
//
// The update is at::_fused_adamw_ (one multi-tensor kernel per group on CUDA)
// over two groups, decay and no decay; fused_adamw() is the same update for
// any lists of tensors (ZeRO-1 and FSDP run it on their flat slices,
// parallel/flat_slices.h). Moments kept in bf16 (optimizer_state_dtype)
// go through meshtrain::adamw_ (ops/adamw.h) instead: fp32 math, bf16 storage.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct OptimParam {
  std::string name;     // global name (checkpoints)
  at::Tensor param;     // the model's parameter (updated in place)
  bool decay = true;    // weight decay applies
  at::Tensor exp_avg;   // first moment, param's shape, fp32 or bf16 (state_dtype)
  at::Tensor exp_avg_sq;
};

// The learning rate an update reads: a number from the host, or a 0-dim fp32
// tensor on the parameters' device read by the update on the device (a
// captured CUDA graph replays every step with the value written there before
// the replay, train/step_graph.h).
struct LearningRate {
  LearningRate(double v) : value(v) {}  // NOLINT(google-explicit-constructor): a plain number is a learning rate
  explicit LearningRate(at::Tensor t) : tensor(std::move(t)) {}
  double value = 0;
  at::Tensor tensor;  // defined: read instead of value
};

// The dtype AdamW keeps its moments in: optimizer_state_dtype (fp32 default).
at::ScalarType state_dtype(const Config& cfg);

// One AdamW update of params (fp32) from grads with moments exp_avg,
// exp_avg_sq (fp32, or all bf16: ops/adamw.h), all lists of equal length and shapes; step is a 0-dim fp32
// tensor on the parameters' device holding the step number (1 for the first
// update). found_inf (0-dim fp32, optional): the update is skipped on the
// device where it is non-zero, so skipping needs no host read. grad_scale
// (0-dim fp32, optional): the gradients are divided by it inside the update
// (gradient clipping without a pass of its own over the gradients).
void fused_adamw(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                 const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq,
                 const at::Tensor& step, const LearningRate& lr, const LrConfig& cfg, double weight_decay,
                 const at::Tensor& found_inf, const at::Tensor& grad_scale = {});

// AdamW only updates: which tensors it updates from which gradients is its
// caller's (the data-parallel strategy, parallel/data_parallel.h: whole
// parameters, or this rank's slices of flat spaces). It keeps the moments
// of a fixed list of slots and the step counter.
class AdamW {
 public:
  // One slot per entry. Moments the caller leaves undefined start as zeros
  // of state_dtype shaped like `param`; given moments may be views into the
  // caller's flat state (a slice's runs), then `param` may be undefined.
  AdamW(std::vector<OptimParam> params, const LrConfig& cfg, at::ScalarType state_dtype = at::kFloat);
  // Slots whose moments are all given (views of a slice's state); none at
  // all is allowed (a rank whose slices hold only padding). The step counter
  // lives on `device`.
  AdamW(std::vector<OptimParam> slots, const LrConfig& cfg, const at::Device& device);

  // One update with learning rate lr from each parameter's .grad(). Parameters
  // without a gradient are left alone (their moments too). found_inf and
  // grad_scale: see fused_adamw (a skipped update does not count as a step).
  // casts (empty, or one per parameter of params(), undefined where none):
  // bf16 copies the update writes (ops/adamw.h); with any, every parameter
  // goes through meshtrain::adamw_, so all take the same arithmetic.
  void step(const LearningRate& lr, const at::Tensor& found_inf = {}, const at::Tensor& grad_scale = {},
            const std::vector<at::Tensor>& casts = {});
  // The same over tensors given now: values[k] (slot k's place in this
  // step, e.g. a slice of the parameters) updated in place from grads[k];
  // an undefined gradient leaves slot k alone.
  void step(const std::vector<at::Tensor>& values, const std::vector<at::Tensor>& grads, const LearningRate& lr,
            const at::Tensor& found_inf = {}, const at::Tensor& grad_scale = {},
            const std::vector<at::Tensor>& casts = {});

  // Reads the device's step counter (a host sync: checkpoints only).
  int64_t steps_taken() const;
  void set_steps_taken(int64_t s);
  std::vector<OptimParam>& params() { return params_; }
  const std::vector<OptimParam>& params() const { return params_; }

 private:
  std::vector<OptimParam> params_;
  LrConfig cfg_;
  at::Tensor step_;  // 0-dim fp32 on the parameters' device
};

}  // namespace meshtrain
