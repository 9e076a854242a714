#pragma once
// Private to src/dist: how Runtime and Mesh build concrete communicators.
// Deliberately free of mpi.h/nccl.h so only the backend .cpp files see them;
// the MPI handle stays inside mpi_comm.cpp and is reached through the parent.
#include <memory>

#include "meshtrain/core/check.h"
#include "meshtrain/dist/comm.h"

namespace meshtrain {

// A collective's `dim` argument made non-negative and checked against t;
// errors name the backend and the op.
inline int64_t norm_dim(const at::Tensor& t, int64_t dim, const char* backend, const char* op) {
  MT_CHECK(t.dim() > 0, backend, " ", op, ": needs a tensor with at least one dim, got a scalar");
  const int64_t d = dim < 0 ? dim + t.dim() : dim;
  MT_CHECK(d >= 0 && d < t.dim(), backend, " ", op, ": dim ", dim, " out of range for shape ", t.sizes());
  return d;
}

// The dtype every backend reduces `t` in, so a mesh gives the same numbers over
// NCCL and MPI: 16-bit floats are summed in fp32 (MPI has no bf16 arithmetic,
// and fp32 sums keep tp/dp reductions independent of the group size's
// rounding), bools as int (no sum on bools). Results are cast back.
inline at::ScalarType reduction_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
    case at::kBFloat16: return at::kFloat;
    case at::kBool: return at::kInt;
    default: return t;
  }
}

// A private duplicate of MPI_COMM_WORLD (errors returned, not fatal), so our
// traffic never matches messages of other libraries on the world communicator.
std::unique_ptr<Communicator> mpi_world_communicator();

// MPI_Comm_split of `parent` (which must be an MPI communicator): ranks with the
// same color form a group, ordered by key.
std::unique_ptr<Communicator> mpi_split(const Communicator& parent, int color, int key);

// An NCCL communicator over the same group as `bootstrap` (an MPI communicator
// used only to broadcast the unique id), on the current CUDA device. Throws
// "built without NCCL" when meshtrain was compiled without nccl.h.
std::unique_ptr<Communicator> nccl_communicator(Communicator& bootstrap);

// Wraps an MPI communicator so it also serves CUDA tensors, through pinned
// host buffers (src/dist/host_staging.cpp); CPU tensors pass straight through.
std::unique_ptr<Communicator> host_staged(std::unique_ptr<Communicator> inner);

}  // namespace meshtrain
