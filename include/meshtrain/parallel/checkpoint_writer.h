#pragma once
// What a checkpoint save moves, and to whom. The checkpoint layout gives each
// shard one writer (dp rank 0, tp rank 0 for replicated tensors, never a tied
// copy; ckpt/checkpoint.h NamedTensor::write): only that rank brings the
// tensor to the host, and state sharded over dp (ZeRO-1 and FSDP moments,
// zero_stage 3 parameters) is gathered to it alone, a chunk at a time, instead
// of being all-gathered whole onto every rank's device.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "meshtrain/dist/comm.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

// At most this many bytes arrive at the writer per collective: a save's extra
// device memory stays at one chunk however large the model.
inline constexpr int64_t kCheckpointGatherBytes = int64_t{64} << 20;

// The host side of one component's save. CUDA tensors are copied into pinned
// host memory with non-blocking copies on the current stream, waited for once
// (wait()); CPU tensors are written as they are, with no copy.
class HostCopies {
 public:
  explicit HostCopies(int64_t gather_bytes = kCheckpointGatherBytes);

  // t's values on the host, readable after wait(): t itself on the CPU.
  at::Tensor add(const at::Tensor& t);
  // An uninitialised host tensor that copy() fills from tensors on `from`
  // (pinned when `from` is a CUDA device).
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype, const at::Device& from);
  // dst (from empty()) <- src, cast to dst's dtype; non-blocking from CUDA.
  void copy(const at::Tensor& dst, const at::Tensor& src);
  // Waits for every copy: one synchronisation of the current stream.
  void wait();

  int64_t gather_bytes() const { return gather_bytes_; }
  // Device-to-host bytes copied (0 on CPU ranks).
  int64_t copied_bytes() const { return copied_bytes_; }
  // Host bytes of every tensor handed out by add() and empty(): what this rank
  // will write, copied or not.
  int64_t host_bytes() const { return host_bytes_; }

 private:
  int64_t gather_bytes_;
  int64_t copied_bytes_ = 0;
  int64_t host_bytes_ = 0;
  bool pending_ = false;
  at::Device device_ = at::kCPU;  // the CUDA device copied from, to synchronise
};

// Whether this rank writes the shard of a parameter laid out as l (and the
// parameter's moments): dp rank 0 (routed experts under expert parallelism:
// the first holder, dp rank < ep), tp rank 0 for replicated tensors, never the
// tied head copy.
bool writes_checkpoint(const ParamLayout& l, const Mesh& mesh);

// Whether rank 0 of this rank's dp group (expert_dp for routed experts under
// expert parallelism) writes it: what sharded state is gathered to that rank.
// The same on every rank of the group.
bool group_writes_checkpoint(const ParamLayout& l, const Mesh& mesh);

// A flat space sharded over comm, of which this rank holds `local` ([slice];
// rank r the slice [r*slice, (r+1)*slice)), holding pm.params[params[j]] at
// offsets[j]: the parameters with written[j] gathered to comm's rank 0 into
// host tensors of their shapes, out[params[j]] (dtype: the parameter's when
// in_param_dtype, else local's). At most host.gather_bytes() arrive per
// collective; chunks holding nothing written are not sent. Other ranks' out is
// left alone. Collective over comm.
void gather_to_writer(const ParallelModel& pm, const std::vector<size_t>& params,
                      const std::vector<int64_t>& offsets, const std::vector<bool>& written,
                      const at::Tensor& local, Communicator& comm, bool in_param_dtype, HostCopies& host,
                      std::vector<at::Tensor>& out);

// The parameters this rank writes, on the host (undefined where it writes
// none), in pm.params order. zero_stage 3 gathers them from the owned slices
// to the writers (collective over dp and expert_dp); otherwise local.
std::vector<at::Tensor> params_to_save(ParallelModel& pm, const Mesh& mesh, HostCopies& host);

}  // namespace meshtrain
