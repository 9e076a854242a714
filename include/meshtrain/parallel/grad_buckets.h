#pragma once
// Data-parallel gradient reduction overlapped with backward (zero_stage 0,
// overlap_grad_reduce): PyTorch DDP's reducer and Megatron's overlapped
// grad reduce, reduced to what meshtrain needs.
//
// The dp-summed parameters of this rank are cut into buckets of about
// grad_bucket_mb, in reverse ParallelModel::params order (roughly the order
// backward finishes them), each of one dtype and one flat buffer, in which
// the gradients live as views (DDP's gradient_as_bucket_view: the hook moves a
// step's first gradient of a parameter in, later passes accumulate in place),
// so a bucket is all-reduced in place, without a cat and a copy back. A post-accumulate-grad hook on
// every such parameter counts it ready once its gradient is final, that is
// during the step's last backward pass through it (arm(), called by the
// pipeline executors before that pass). A bucket whose parameters are all
// ready is all-reduced at once, while backward goes on. Buckets are launched
// strictly in index order, so every dp rank issues the same collectives in
// the same order whatever order its hooks fire in (an expert that got no
// token here and some there); finish() launches what is left (missing
// gradients as zeros) and waits for all of them.
//
// On CUDA the all-reduce runs on a side stream that first waits for the
// stream that produced the gradients (an event); finish() makes the current
// stream wait for the side stream. On CPU (MPI) the all-reduce is synchronous
// inside the hook.
//
// Left to the replicated strategy's reduce() after backward (different groups
// or an extra sum first): sequence-parallel norm gradients (tp sum), the tied
// embedding across pipeline stages (pp sum), and everything under expert
// parallelism (make_data_parallel in parallel/data_parallel.cpp says why).
// The sharded strategies (ZeRO-1, FSDP) use no buckets.
#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

class GradBuckets {
 public:
  // Hooks the parameters it covers (covers()).
  GradBuckets(ParallelModel& pm, Mesh& mesh, int64_t bucket_bytes);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // The next backward pass through layer chunk `chunk` is the step's last
  // one for its parameters: their gradients become final during it. The
  // embedding belongs to chunk 0, the final norm and head to the last chunk.
  void arm(int64_t chunk);
  // Launches the buckets not launched yet, waits for every bucket and disarms.
  // Collective over dp; the replicated strategy's reduce() calls it.
  void finish();
  // Whether parameter k (an index into ParallelModel::params) is summed here.
  bool covers(size_t k) const { return bucket_of_[k] >= 0; }

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // Buckets launched from hooks, i.e. during backward, in the last step (tests).
  int64_t launched_in_backward() const { return last_launched_in_backward_; }
  // Covered parameters, and those whose gradient is now a view of its bucket (tests).
  int64_t bucketed_params() const;
  int64_t grads_in_buckets() const;

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into ParallelModel::params
    size_t ready = 0;
    at::Tensor flat;             // the gradients of `params`, one after the other
  };
  // Makes parameter k's gradient the view of its bucket (copying it in).
  void adopt(size_t k);
  void on_grad_ready(size_t param);
  void launch_ready();
  void launch(Bucket& b);

  ParallelModel& pm_;
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_;  // per parameter: its bucket, or -1
  std::vector<int64_t> chunk_of_;   // per parameter: its layer chunk
  std::vector<at::Tensor> view_of_;  // per covered parameter: its gradient's place in its bucket
  std::vector<char> armed_, ready_;
  size_t next_ = 0;  // the first bucket not launched yet
  int64_t launched_in_backward_ = 0, last_launched_in_backward_ = 0;
  bool in_finish_ = false;
  std::optional<c10::Stream> side_;  // CUDA: where the all-reduces run
};

}  // namespace meshtrain
