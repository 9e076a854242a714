#pragma once
// Which GPU each rank drives. The ranks on one host are numbered 0..local_size-1
// (Runtime::local_rank, from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)); local
// rank i takes the i-th GPU this process can see, so CUDA_VISIBLE_DEVICES (and
// schedulers that set it) decide which physical GPUs a host offers.
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct NodeTopology {
  std::string host;
  int world_rank = 0;
  int local_rank = 0;    // among the ranks on this host
  int local_size = 1;    // ranks on this host
  int visible_gpus = 0;  // CUDA devices this process sees (after CUDA_VISIBLE_DEVICES)
};

// The CUDA device index of this rank (pure, so tests can mock a topology).
// - as many visible GPUs as ranks on the host, or more: local rank i takes GPU i;
// - exactly one visible GPU: GPU 0. That is how launchers that give each rank
//   its own GPU look (CUDA_VISIBLE_DEVICES set per rank, srun
//   --gpus-per-task=1): 8 ranks, 1 GPU each. Whether the ranks really see
//   different GPUs is checked next, by UUID (check_one_gpu_per_rank);
// - 2..local_size-1 visible GPUs: an error naming the host and the counts,
//   unless share_gpus (collectives "mpi": ranks may share a GPU, round-robin).
// No visible GPU at all is always an error.
int cuda_device_index(const NodeTopology& topo, bool share_gpus);

// The GPU a rank took: its host and the device's UUID ("GPU-8f2a...").
struct RankGpu {
  int world_rank = 0;
  std::string host;
  std::string uuid;
};

// Every rank's RankGpu (gathered over the world): throws when two or more
// ranks on one host drive the same GPU, naming the host, the GPU and the
// ranks (NCCL needs one GPU per rank), unless share_gpus (collectives "mpi").
void check_one_gpu_per_rank(const std::vector<RankGpu>& ranks, bool share_gpus);

// The UUID of visible device `index`, as nvidia-smi -L prints it
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"); "" in CPU builds.
std::string cuda_device_uuid(int index);

// How the host's tools (nvidia-smi) name visible device `index`: the
// CUDA_VISIBLE_DEVICES entry at that position, or the index when the variable
// is unset or shorter. `cuda_visible_devices` is the variable's value (null: unset).
std::string physical_gpu_id(const char* cuda_visible_devices, int index);

// CUDA devices this process sees (0 without CUDA or in a CPU build).
int visible_cuda_devices();

// Makes `index` the current CUDA device of this process; call it before any
// other CUDA or NCCL work so nothing lands on GPU 0 by default. Throws in CPU
// builds.
c10::Device use_cuda_device(int index);

// The device's product name ("NVIDIA H100 80GB HBM3"); "" in CPU builds.
std::string cuda_device_name(int index);
// The device's memory in bytes (cudaDeviceProp::totalGlobalMem); 0 in CPU
// builds or when it cannot be read.
int64_t cuda_device_memory(int index);

// The NCCL library's version at run time (ncclGetVersion), e.g. "2.28.9";
// "" when meshtrain was built without NCCL.
std::string nccl_runtime_version();

}  // namespace meshtrain
