#pragma once
// FSDP over dp: ZeRO stages 2 and 3 (Rajbhandari et al. 2020; PyTorch FSDP,
// Zhao et al. 2023), the layout of the Jaxformer moe1B run.
//
// A rank's parameters (its pipeline stage, its tp shard) fall into units: one
// per transformer layer and a root unit with the rest (embedding, final norm,
// head). Each unit lays its parameters out in flat fp32 spaces, in
// ParallelModel::params order, padded to a multiple of the group size: one
// over dp, and under expert parallelism one for the routed experts over the
// ranks holding the same experts (Mesh::expert_dp()). Rank r of a group owns
// the contiguous slice [r*S, (r+1)*S) of each space.
//
// zero_stage 2: parameters stay whole on every rank. A layer's gradients are
// reduce-scattered into the owned slices as soon as the layer's backward is
// done, and the whole gradients are freed: no full gradient outlives its
// layer. The optimizer (parallel/fsdp_optimizer.cpp) updates the owned slices
// and all-gathers them back into the parameters.
// zero_stage 3: the owned slices are the parameters (fp32 master copy); the
// whole tensors have no memory at rest. A layer is all-gathered just before
// its forward and freed after it; the hook left on its output gathers it
// again just before its backward, and it is freed once its gradients are
// reduce-scattered. The root unit is gathered at its first use in a step and
// freed after the optimizer step.
//
// A layer's backward is known to be done when the backward of the layer
// before it starts (its output hook fires: every node of the later layer was
// created after it and runs first), or when the backward pass ends (an engine
// callback): an order every dp rank shares, so the collectives match even
// when an expert got no token on one rank and some on another.
//
// Communication is blocking here (MPI and NCCL calls return when queued or
// done): the next layer's all-gather is not prefetched.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "meshtrain/dist/mesh.h"
#include "meshtrain/model/layer_hooks.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

class Fsdp : public LayerHooks {
 public:
  // One flat space of a unit, sharded over `comm`.
  struct Flat {
    Communicator* comm = nullptr;
    std::vector<size_t> params;    // indices into ParallelModel::params
    std::vector<int64_t> offsets;  // start of each of them in the flat space
    int64_t numel = 0, padded = 0, slice = 0, begin = 0;
    at::Tensor shard;  // stage 3: [slice] fp32, this rank's slice of the parameters
    at::Tensor grad;   // [slice] summed gradient of the owned slice, over the step's backward passes
  };
  struct Unit {
    int64_t layer = -1;        // global layer index; -1: the root unit
    std::vector<Flat> flats;   // the dp space, then the experts' space (if any)
    bool whole = true;         // the parameters hold their values in full
  };

  // Lays the units out and, for stage 3, keeps only the owned slices.
  Fsdp(ParallelModel& pm, Mesh& mesh, int stage);

  int stage() const { return stage_; }
  std::vector<Unit>& units() { return units_; }
  const std::vector<Unit>& units() const { return units_; }

  void before_layer(size_t block) override;
  at::Tensor after_layer(size_t block, at::Tensor out) override;
  void before_root() override;

  // The root unit's gradients (summed over tp and the tied pipeline copies by
  // synchronize_gradients) into its owned slices. Collective over dp.
  void reduce_root();
  // Stage 3: every unit whole (collective), e.g. to load them. Saves gather
  // the shards to the writers instead (parallel/checkpoint_writer.h).
  void gather_all();
  // After the whole parameters were written (checkpoint load, --init-from-hf):
  // each rank keeps its slices of them. Stage 3 frees the whole tensors;
  // stage 2 has nothing to do. Local.
  void params_written();
  // Stage 3: frees every whole unit (after the optimizer step, after saving).
  void release_all();
  // Sets the accumulated gradient slices to zero.
  void zero_grad();

 private:
  void init_flat(Flat& f, Communicator& comm);
  void gather(Unit& u);
  void release(Unit& u);
  void pre_backward(size_t unit);
  // Reduce-scatters a unit's whole gradients into its slices and frees them
  // (and, stage 3, the parameters). tp: sum the sequence-parallel gradients
  // over tp first (the root's were summed by synchronize_gradients).
  void reduce_unit(Unit& u, bool tp);
  void finish_backward();

  ParallelModel& pm_;
  Mesh& mesh_;
  int stage_;
  std::vector<Unit> units_;          // units_[0]: root; units_[j + 1]: local block j
  std::vector<size_t> in_backward_;  // units whose backward started and is not reduced yet
  bool callback_queued_ = false;
};

// The owned slice of a flat space from the whole parameters: [slice] fp32.
at::Tensor owned_slice(const ParallelModel& pm, const Fsdp::Flat& f);

// Makes pm's parameters whole for reading or writing them outside training
// (checkpoint loads, weight import; collective over dp), and shards them again
// afterwards (local): no-ops unless zero_stage 3.
void gather_params(ParallelModel& pm);
void release_params(ParallelModel& pm, bool written);

}  // namespace meshtrain
