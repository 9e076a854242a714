#pragma once
// What every data-parallel strategy (parallel/data_parallel.h) does to the
// gradients besides its own dp sum: the sums over the other mesh axes, and
// the global norm from a rank's share of the squares.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

// Over the parameters `params` (indices into pm.params) a strategy sums
// after backward: a trainable one without a gradient (an expert that got no
// token here) gets zeros, so every rank reaches the same collectives; the
// gradients partial over tp (sequence-parallel norms) are summed over tp;
// and the embedding's first- and last-stage copies (the tied head's, the
// multi-token prediction modules') sum their gradients over pp (every stage
// takes part: the ones between contribute zeros).
void sum_partial_gradients(ParallelModel& pm, Mesh& mesh, const std::vector<size_t>& params);

// Sum of the tensors over `comm`, in flat buckets of one dtype and at most
// bucket_bytes (one collective per bucket, not per tensor).
void all_reduce_flat(std::vector<at::Tensor>& tensors, Communicator& comm, int64_t bucket_bytes = 32 << 20);

// The global L2 norm (0-dim fp64) from this rank's sum of squares [1]
// (fp64), summed over the axes whose ranks hold different parts: tp and pp
// always, dp where the gradients are sharded over it (each dp rank holds a
// different slice), never where dp ranks hold replicas.
at::Tensor global_norm(at::Tensor sum_sq, Mesh& mesh, bool sharded_over_dp);

// Indices 0 .. pm.params.size() - 1.
std::vector<size_t> all_params(const ParallelModel& pm);

}  // namespace meshtrain
