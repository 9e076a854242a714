#pragma once
// The one owner of the gradients after backward, and of the update: the
// data-parallel strategy parallelize() makes for this rank, chosen once from
// zero_stage (make_data_parallel, the one place it is read outside config
// and plan). As FSDP owns reduction in torchtitan, and Megatron-Core's
// data-parallel buffer + finalize_model_grads + optimizer do together:
//
//   replicated (zero_stage 0, parallel/replicated.cpp): whole gradients
//     summed over dp, in buckets during the step's last backward pass
//     (overlap_grad_reduce, parallel/grad_buckets.h) or after it; AdamW
//     over the whole parameters, writing their bf16 casts
//     (optimizer_writes_casts).
//   ZeRO-1 (zero_stage 1, parallel/zero.h): after backward the gradients are
//     reduce-scattered into this rank's slice of a flat space; AdamW on the
//     slice; the slices all-gathered back into the parameters.
//   FSDP (zero_stage 2 and 3, parallel/fsdp.h): each layer's gradients
//     reduce-scattered as its backward ends, the root unit's after the last
//     pass; AdamW on the owned slices; stage 2 all-gathers them, stage 3
//     keeps them as the parameters.
//
// A step, after its backward passes (train/step.cpp):
//   reduce()                              every sum the gradients still need:
//                                         tp's sequence-parallel partials, the
//                                         tied embedding's pipeline copies,
//                                         dp / expert_dp
//   norm = grad_norm()                    the one global L2 norm, each
//                                         parameter counted once
//   update(lr, found_inf, grad_scale)     AdamW (optim/adamw.h, which only
//                                         updates the tensors it is given) over
//                                         this rank's share, then what the
//                                         next forward needs gathered back
// Nothing here reads device memory on the host: the norm stays a device
// tensor until the step is logged. Checkpoints see the optimizer state as
// whole per-parameter moments by global name (moments_to_save /
// load_moments), whatever the strategy, so they load on any mesh.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/optim/adamw.h"

namespace meshtrain {

struct ParallelModel;
class Fsdp;
class GradBuckets;
class HostCopies;

// Bytes a rank holds for parameters, gradients and optimizer state, as its
// tensors stand (train/plan.h models the same three).
struct ResidentBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
};
// What pm's parameters and their .grad() hold (each storage once).
ResidentBytes parameter_bytes(const ParallelModel& pm);

class DataParallel {
 public:
  virtual ~DataParallel() = default;

  // The next backward pass through layer chunk `chunk` is the step's last
  // for its parameters (the pipeline's executors say so): buckets then sum
  // them as they become final. A no-op where nothing reduces during backward
  // that way.
  virtual void arm(int64_t /*chunk*/) {}
  // After the step's backward passes: every sum the gradients still need.
  // Collective.
  virtual void reduce() = 0;
  // After reduce(): the global L2 norm of the gradients, each parameter
  // counted once whatever the mesh (0-dim fp64 on the device). Collective.
  virtual at::Tensor grad_norm() = 0;
  // AdamW with learning rate lr over this rank's share; a no-op on the
  // device where found_inf (0-dim fp32, optional) is non-zero; gradients
  // divided by grad_scale (0-dim fp32, optional: clipping) inside the
  // update. Collective for ZeRO-1 and FSDP stage 2 (they gather).
  virtual void update(const LearningRate& lr, const at::Tensor& found_inf = {}, const at::Tensor& grad_scale = {}) = 0;

  // Updates made (a host read of the device counter: checkpoints only).
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t s) = 0;
  // Elements of optimizer state this rank holds (both moments).
  virtual int64_t state_numel() const = 0;
  // The whole per-parameter moments this rank writes into a checkpoint, on
  // the host (parallel/checkpoint_writer.h), in ParallelModel::params order;
  // undefined where another rank writes them. Sharded strategies gather the
  // slices to the writers only, chunk by chunk (collective over dp).
  // load_moments takes whole per-parameter moments back (undefined: zeros).
  virtual std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> moments_to_save(HostCopies& host) = 0;
  virtual void load_moments(const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq) = 0;
  // Parameters, gradients and optimizer state this rank holds now, in bytes.
  virtual ResidentBytes resident_bytes() const = 0;

  // FSDP's units (gathers for checkpoints and weight loads), or null.
  virtual Fsdp* fsdp() { return nullptr; }
  // The gradient buckets (replicated with overlap_grad_reduce), or null.
  virtual const GradBuckets* buckets() const { return nullptr; }
  // The replicated AdamW (zero_stage 0, whole parameters), or null.
  virtual AdamW* adamw() { return nullptr; }
};

// The strategy for pm on this mesh: zero_stage as it runs (zero_stage_on:
// dp 1 has nothing to shard) picks it. Installs what runs during backward
// (FSDP's layer hooks, the buckets' gradient hooks); pm must not move
// afterwards (ParallelModel cannot).
std::unique_ptr<DataParallel> make_data_parallel(ParallelModel& pm, Mesh& mesh, const Config& cfg);

}  // namespace meshtrain
