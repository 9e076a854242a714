#pragma once
// Private to src/dist: how Runtime and Mesh build concrete communicators.
// Deliberately free of mpi.h/nccl.h so only the backend .cpp files see them;
// the MPI handle stays inside mpi_comm.cpp and is reached through the parent.
#include <memory>
#include <vector>

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

// all_to_all_v's arguments checked against t and the group size; returns the
// bytes of one row (dim 0 slice). Errors name the backend, the rank and the
// bad count.
inline int64_t row_bytes_for_all_to_all_v(const at::Tensor& t, const std::vector<int64_t>& send_rows,
                                          const std::vector<int64_t>& recv_rows, int rank, int size,
                                          const char* backend) {
  MT_CHECK(t.defined() && t.dim() > 0, backend, " all_to_all_v on rank ", rank,
           ": needs a defined tensor with at least one dim");
  MT_CHECK(static_cast<int>(send_rows.size()) == size && static_cast<int>(recv_rows.size()) == size, backend,
           " all_to_all_v on rank ", rank, ": ", send_rows.size(), " send and ", recv_rows.size(),
           " receive counts for a group of ", size, " ranks");
  int64_t sent = 0;
  for (int j = 0; j < size; ++j) {
    MT_CHECK(send_rows[j] >= 0 && recv_rows[j] >= 0, backend, " all_to_all_v on rank ", rank,
             ": negative row count for peer ", j);
    sent += send_rows[j];
  }
  MT_CHECK(sent == t.size(0), backend, " all_to_all_v on rank ", rank, ": send counts add up to ", sent,
           " rows but the tensor has ", t.size(0), " (shape ", t.sizes(), ")");
  int64_t row = static_cast<int64_t>(t.element_size());
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  return row;
}

// The dtype every backend reduces `t` in. Floats are reduced in their own
// dtype, as Megatron does: a bf16/fp16 tensor-parallel all-reduce or
// reduce-scatter moves 2 bytes an element, not the 4 of an fp32 upcast (and
// no upcast copy). NCCL sums bf16/fp16 natively; MPI has no 16-bit float type,
// so mpi_comm.cpp sums them with its own MPI_Ops (each pair through float,
// rounded back once per add, as NCCL's kernels do). Where precision matters the
// caller's tensor is fp32 already (dp gradient reduction: master grads are
// fp32). Bools are reduced as int (no sum on bools).
inline at::ScalarType reduction_dtype(at::ScalarType t) { return t == at::kBool ? at::kInt : t; }

// The checks every backend makes of an op's arguments; errors name the
// backend, the op and the rank.
inline void check_tensor(const at::Tensor& t, bool on_its_device, const char* backend, const char* op, int rank,
                         const char* serves) {
  MT_CHECK(t.defined(), backend, " ", op, " on rank ", rank, ": undefined tensor");
  MT_CHECK(on_its_device, backend, " ", op, " on rank ", rank, ": tensor is on ", t.device(), "; ", serves);
}
inline void check_peer(int peer, int size, const char* backend, const char* op, int rank, const char* what) {
  MT_CHECK(peer >= 0 && peer < size, backend, " ", op, " on rank ", rank, ": ", what, " ", peer,
           " is outside the group of size ", size);
}

// The tensor layouts both backends share; the wire calls are each backend's.
// all_gather: the size blocks land in [size, *x], then merge along d.
inline at::Tensor stacked_empty(const at::Tensor& x, int size) {
  std::vector<int64_t> stacked{size};
  stacked.insert(stacked.end(), x.sizes().begin(), x.sizes().end());
  return at::empty(stacked, x.options());
}
inline at::Tensor merge_blocks(const at::Tensor& stacked, int64_t d) {
  return stacked.movedim(0, d).flatten(d, d + 1).contiguous();
}
// reduce_scatter: backends scatter contiguous blocks in rank order, so the
// chunk index of dim d goes first (in the reduction dtype); block r is then
// exactly rank r's chunk.
inline at::Tensor chunks_first(const at::Tensor& t, int64_t d, int size, const char* backend) {
  MT_CHECK(t.size(d) % size == 0, backend, " reduce_scatter: dim ", d, " of shape ", t.sizes(),
           " is not divisible by the group size ", size);
  return t.to(reduction_dtype(t.scalar_type())).unflatten(d, {size, t.size(d) / size}).movedim(d, 0).contiguous();
}
// gather: the root's output, the size ranks' x one after another along dim 0.
inline at::Tensor gathered_empty(const at::Tensor& x, int size) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] *= size;
  return at::empty(shape, x.options());
}
// all_to_all: dim 0 in size equal blocks.
inline void check_all_to_all(const at::Tensor& t, int size, const char* backend) {
  MT_CHECK(t.dim() > 0 && t.size(0) % size == 0, backend, " all_to_all: dim 0 of shape ", t.sizes(),
           " is not divisible by the group size ", size);
}
// all_to_all_v: the rows received from every peer, in rank order.
inline at::Tensor received_empty(const at::Tensor& x, const std::vector<int64_t>& recv_rows) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = 0;
  for (int64_t r : recv_rows) shape[0] += r;
  return at::empty(shape, x.options());
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
