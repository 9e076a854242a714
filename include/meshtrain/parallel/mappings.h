#pragma once
// Megatron's autograd collectives over the tp group: each forward collective
// is paired with the backward collective that makes the gradient exact.
//
//   copy_to_tp            fwd identity              bwd all-reduce
//   reduce_from_tp        fwd all-reduce            bwd identity
//   scatter_to_tp(dim)    fwd keep own chunk        bwd all-gather
//   gather_from_tp(dim)   fwd all-gather            bwd keep own chunk
// Sequence parallelism (activations [B, T, d] split along T = kSequenceDim):
//   gather_from_sequence        fwd all-gather      bwd reduce-scatter
//   reduce_scatter_to_sequence  fwd reduce-scatter  bwd all-gather
//   gather_sequence_replicated  fwd all-gather      bwd keep own chunk
//   scatter_sequence            fwd keep own chunk  bwd all-gather
// The first SP pair brackets a tp region whose ranks compute partial results;
// the second brackets replicated compute on the full sequence, whose gradient
// is already complete on every rank.
//
// The communicator must outlive the autograd graph (backward calls it).
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "meshtrain/dist/comm.h"

namespace meshtrain {

constexpr int64_t kSequenceDim = 1;

at::Tensor copy_to_tp(const at::Tensor& x, Communicator& tp);
at::Tensor reduce_from_tp(const at::Tensor& x, Communicator& tp);
at::Tensor scatter_to_tp(const at::Tensor& x, Communicator& tp, int64_t dim);
at::Tensor gather_from_tp(const at::Tensor& x, Communicator& tp, int64_t dim);

at::Tensor gather_from_sequence(const at::Tensor& x, Communicator& tp);
at::Tensor reduce_scatter_to_sequence(const at::Tensor& x, Communicator& tp);
at::Tensor gather_sequence_replicated(const at::Tensor& x, Communicator& tp);
at::Tensor scatter_sequence(const at::Tensor& x, Communicator& tp);

// Along any dim of any group (context parallelism's exchange): fwd
// all-gather, bwd reduce-scatter, as gather_from_sequence.
at::Tensor gather_from_group(const at::Tensor& x, Communicator& group, int64_t dim);

}  // namespace meshtrain
