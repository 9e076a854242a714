#pragma once
// The optimizer as the training step sees it, whatever it shards: one
// interface for AdamW with replicated state (zero_stage 0), ZeRO-1
// (parallel/zero.h) and FSDP (zero_stage 2/3, parallel/fsdp.h).
// A step (train/step.h), after backward and synchronize_gradients():
//   norm = reduce_gradients()        the global gradient norm (device tensor)
//   step(lr, found_inf, grad_scale)  the update, skipped on the device if
//                                    found_inf, gradients divided by grad_scale
//                                    (clipping) inside the fused update
// Nothing here reads device memory on the host: the norm is read when the
// step is logged (train/step_log.h), so the GPU never waits for the host mid-step.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

class AdamW;
class HostCopies;

// Bytes a rank holds for parameters, gradients and optimizer state, as its
// tensors stand (train/plan.h models the same three).
struct ResidentBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
};
// What pm's parameters and their .grad() hold (each storage once).
ResidentBytes parameter_bytes(const ParallelModel& pm);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // The dp reduction this optimizer needs (ZeRO-1: reduce-scatter; FSDP: the
  // root unit's reduce-scatter, the layers' ran during backward; replicated:
  // done by synchronize_gradients) and the global L2 norm of the gradients,
  // each parameter counted once: a 0-dim fp64 tensor on the device. Collective.
  virtual at::Tensor reduce_gradients() = 0;
  // AdamW with learning rate lr; a no-op on the device where found_inf (0-dim
  // fp32, optional) is non-zero; the gradients are divided by grad_scale
  // (0-dim fp32, optional: clipping) as the update reads them, not in a pass
  // of their own. Collective for ZeRO-1 and FSDP stage 2 (they gather the
  // updated slices).
  virtual void step(const LearningRate& lr, const at::Tensor& found_inf = {}, const at::Tensor& grad_scale = {}) = 0;
  // Updates made (a host read of the device counter: checkpoints only).
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t s) = 0;
  // Elements of optimizer state this rank holds (both moments).
  virtual int64_t state_numel() const = 0;
  // The whole per-parameter moments this rank writes into a checkpoint, on
  // the host (parallel/checkpoint_writer.h), in ParallelModel::params order;
  // undefined where another rank writes them. ZeRO-1 and FSDP gather the
  // slices to the writers only, chunk by chunk (collective over dp).
  // load_moments takes whole per-parameter moments back (undefined: zeros).
  // Checkpoints do not depend on sharding.
  virtual std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> moments_to_save(HostCopies& host) = 0;
  virtual void load_moments(const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq) = 0;
  // The replicated AdamW inside, or nullptr (ZeRO-1, FSDP).
  virtual AdamW* adamw() { return nullptr; }
  // Parameters, gradients and optimizer state this rank holds now, in bytes.
  virtual ResidentBytes resident_bytes() const = 0;
};

// The optimizer over what parallelize() (parallel/parallelize.h) made of the
// model; it installs nothing. zero_stage 3 and 2: AdamW over pm.fsdp's shards
// (parallel/fsdp.h); 1: ZeroOptimizer; 0: AdamW over every parameter of this
// rank (its gradients summed by synchronize_gradients or pm.grad_buckets).
std::unique_ptr<Optimizer> make_optimizer(ParallelModel& pm, Mesh& mesh, const Config& cfg);
// zero_stage 2 or 3, over pm.fsdp (parallel/fsdp_optimizer.cpp).
std::unique_ptr<Optimizer> make_fsdp_optimizer(ParallelModel& pm, Mesh& mesh, const Config& cfg);

}  // namespace meshtrain
