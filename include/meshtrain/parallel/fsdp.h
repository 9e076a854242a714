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
// done (under a zero-bubble schedule: once the W pass that completes them
// ran, WeightGradQueue::after_run), and the whole gradients are freed: no
// full gradient outlives its layer. The FSDP strategy
// (parallel/fsdp_data_parallel.cpp) updates the owned slices and all-gathers
// them back into the parameters.
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
// Gathers in the compute dtype: under bf16 mixed precision, stage 3 lays a
// layer's weights that the layers read only as bf16 casts
// (ParamLayout::compute_cast: linear and expert matrices) out in flat spaces
// of their own, and gathers them by casting the owned slice and
// all-gathering the bf16 slices (half the bytes). The gathered bf16 tensor is
// handed to the layers as the weights' casts (MixedPrecision::provide), behind
// an autograd node per forward whose backward is the cast's (the gradient in
// fp32, into the fp32 parameter); the fp32 whole weights are never made.
// Norms, biases and the router stay in fp32 flats, gathered in fp32.
//
// Overlap: when a layer is gathered for its forward, the next layer's gather
// is launched too (prefetch; in backward, the previous layer's). On CUDA
// every FSDP collective runs on a side stream that first waits for the
// compute stream (an event), the compute stream waits for a gather's event
// before the layer reads it, and tensors used on both streams are marked
// with record_stream; the end of each backward pass and the optimizer wait for
// the side stream. On CPU (MPI) the same calls run in order, synchronously.
//
// fsdp_keep_gathered: a layer gathered in a step stays gathered until the
// optimizer step (stage 3), and the layers' gradients accumulate whole over
// the step's microbatches and are reduce-scattered once, after the last
// backward (reduce_root): one gather and one reduce-scatter per layer and
// step instead of two gathers and one reduce-scatter per microbatch, for the
// memory of the whole gathered layers (compute dtype) and whole fp32
// gradients (`plan` counts both).
#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <optional>
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
    // Gathered in: fp32, or the compute dtype (stage 3, compute_cast weights).
    at::ScalarType dtype = at::kFloat;
    at::Tensor gathered;           // compute dtype: [padded], its memory freed at rest
    std::vector<at::Tensor> casts;  // compute dtype: views of `gathered`, one per parameter
  };
  struct Unit {
    int64_t layer = -1;        // global layer index; -1: the root unit
    std::vector<Flat> flats;   // per space (dp, the experts' over expert_dp), fp32 and compute dtype
    bool whole = true;         // gathered for compute: fp32 parameters and compute-dtype casts hold their values
    bool masters = true;       // every parameter holds its fp32 values (stage 2, gather_all())
    std::optional<c10::Event> ready;  // CUDA: the gather's end on the side stream
  };

  // Lays the units out and, for stage 3, keeps only the owned slices.
  // keep_gathered: Config::fsdp_keep_gathered.
  Fsdp(ParallelModel& pm, Mesh& mesh, int stage, bool keep_gathered = false);

  int stage() const { return stage_; }
  bool keep_gathered() const { return keep_; }
  std::vector<Unit>& units() { return units_; }
  const std::vector<Unit>& units() const { return units_; }

  void before_layer(size_t block) override;
  at::Tensor after_layer(size_t block, at::Tensor out) override;
  void before_root() override;

  // The root unit's gradients (summed over tp and the tied pipeline copies by
  // synchronize_gradients) into its owned slices, after the layers' under
  // keep_gathered; the compute stream then waits for every FSDP collective.
  // Collective over dp.
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
  void init_flat(Flat& f, Communicator& comm, at::ScalarType dtype);
  // Launches u's gather (on the side stream on CUDA); gather() also makes the
  // compute stream wait for it.
  void launch_gather(Unit& u);
  void gather(Unit& u);
  // Launches the gather of units_[next] when it holds the layer after (or,
  // backward, before) units_[from]'s on this stage: the next one to run.
  void prefetch(size_t from, size_t next);
  void release(Unit& u);
  // The compute stream waits for what was issued on the side stream.
  void wait_side();
  void pre_backward(size_t unit);
  // Reduce-scatters a unit's whole gradients into its slices and frees them
  // (and, stage 3, the parameters). tp: sum the sequence-parallel gradients
  // over tp first (the root's were summed by synchronize_gradients).
  void reduce_unit(Unit& u, bool tp);
  // Unit k's backward ended: reduce it now, or after the W of a zero-bubble B.
  void backward_done(size_t k);
  void finish_backward();

  ParallelModel& pm_;
  Mesh& mesh_;
  int stage_;
  bool keep_;
  std::optional<c10::Stream> side_;  // CUDA: where FSDP's collectives run
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
