#pragma once
// ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models"): the AdamW moments are sharded over dp.
//
// This rank's parameters (its pipeline stage, its tp shard) are laid out in
// one flat fp32 space, in ParallelModel::params order, padded to a multiple of
// dp; dp rank r owns the contiguous slice [r*S, (r+1)*S). Per step (the
// data-parallel strategy of zero_stage 1, parallel/data_parallel.h):
//   reduce()             the tp/pp sums, the reduce-scatter of the flat
//                        gradient over dp, the global norm
//   update(lr, .., c)    AdamW on the owned slice (clipped by c inside the
//                        fused update), all-gather of the slices
// The update is AdamW's own (optim/adamw.h, slots by weight decay over the
// slice's runs), so zero_stage 0 and 1 give the same losses. Under expert
// parallelism the routed experts form a second flat space, sharded over the
// ranks that hold the same experts (Mesh::expert_dp()). Moments are saved per parameter by
// global name (moments_to_save / load_moments), so checkpoints do not depend on
// dp nor on zero_stage.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/flat_slices.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

class ZeroDataParallel : public DataParallel {
 public:
  // state_dtype: the moments' (optim/adamw.h state_dtype).
  ZeroDataParallel(ParallelModel& pm, Mesh& mesh, const LrConfig& cfg, at::ScalarType state_dtype = at::kFloat);

  // Sums the parameters' .grad() over tp/pp where partial, then over dp,
  // keeping this rank's slice (the whole gradients are freed). Collective.
  void reduce() override;
  // The global L2 norm from the owned slices, each parameter counted once
  // (tp replicas once, tied copies never), identical on every rank. Collective.
  at::Tensor grad_norm() override;
  // AdamW with learning rate lr on the owned slice, then every rank gets every
  // updated slice back into its parameters. Collective.
  void update(const LearningRate& lr, const at::Tensor& found_inf = {}, const at::Tensor& grad_scale = {}) override;

  int64_t steps_taken() const override;
  void set_steps_taken(int64_t s) override;
  // Elements of optimizer state this rank holds (both moments).
  int64_t state_numel() const override;

  // The whole moments of the parameters this rank writes (params order, each
  // in the parameter's shape, on the host), gathered from the dp slices to
  // the writer only. Collective.
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> moments_to_save(HostCopies& host) override;
  // Full per-parameter moments (params order; an undefined tensor: zeros) ->
  // this rank's slice. Local.
  void load_moments(const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq) override;
  ResidentBytes resident_bytes() const override;

 private:
  // One flat space sharded over one communicator: everything over dp, and
  // under expert parallelism the routed experts apart, over expert_dp (the
  // ranks holding the same experts).
  struct Group {
    Communicator* comm = nullptr;
    std::vector<size_t> params;     // indices into pm_.params
    std::vector<int64_t> offsets;   // start of each of them in the flat space
    int64_t padded = 0, slice = 0, begin = 0;
    at::Tensor grad;                // [slice] summed gradient of the owned slice
    at::Tensor exp_avg, exp_avg_sq;
    SliceRuns slices;               // runs by weight decay, norm mask (parallel/flat_slices.h)
  };
  void init_group(Group& g, Communicator& comm, int rank, int size);
  at::Tensor flat_of(const Group& g, const std::vector<at::Tensor>& per_param) const;  // [padded] fp32
  at::Tensor owned_slice(const Group& g, const std::vector<at::Tensor>& per_param) const;  // [slice]
  void unflatten(const Group& g, const at::Tensor& flat, std::vector<at::Tensor>& out) const;

  ParallelModel& pm_;
  Mesh& mesh_;
  LrConfig cfg_;
  at::ScalarType state_dtype_;
  std::vector<Group> groups_;
  std::unique_ptr<AdamW> opt_;  // over the groups' runs (flat_slices.h slice_slots)
};

}  // namespace meshtrain
