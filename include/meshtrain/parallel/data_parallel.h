#pragma once
// Gradient synchronisation after the backward passes of a step:
//  - tp: gradients of parameters replicated over tp but computed on sequence
//    shards (norms under sequence parallelism) are summed over tp;
//  - pp: the tied embedding's two copies (first and last stage) sum gradients;
//  - dp: gradients summed over dp in flat buckets (losses are already divided
//    by the global token count, so a sum is the global mean); with
//    pm.grad_buckets most of them were summed during backward, which is
//    waited for here (parallel/grad_buckets.h).
#include <vector>

#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

// dp = false leaves the dp sum to the sharded optimizers' reduce-scatters
// (ZeRO-1: parallel/zero.h; FSDP: parallel/fsdp.h, whose parameters are
// marked fsdp_reduced and skipped here whatever dp says).
void synchronize_gradients(ParallelModel& pm, Mesh& mesh, bool dp = true);

// Global L2 norm of all gradients, counting each parameter once whatever the
// mesh (tp shards summed, tp replicas and tied copies counted once): a 0-dim
// fp64 tensor on the parameters' device, from one foreach norm (no host read).
at::Tensor grad_norm(ParallelModel& pm, Mesh& mesh);

// Sum of one flat buffer over `comm`, in buckets of bucket_bytes.
void all_reduce_flat(std::vector<at::Tensor>& tensors, Communicator& comm, int64_t bucket_bytes = 32 << 20);

}  // namespace meshtrain
