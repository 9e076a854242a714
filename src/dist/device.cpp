// GPU selection per rank; see meshtrain/dist/device.h.
#include "meshtrain/dist/device.h"

#include <string>
#include <vector>

#include "meshtrain/core/check.h"

#ifdef MESHTRAIN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace meshtrain {

int cuda_device_index(const NodeTopology& t, bool share_gpus) {
  MT_CHECK(t.local_size >= 1 && t.local_rank >= 0 && t.local_rank < t.local_size, "rank ", t.world_rank,
           " on host ", t.host, ": local rank ", t.local_rank, " is outside the host's ", t.local_size, " ranks");
  MT_CHECK(t.visible_gpus > 0, "rank ", t.world_rank, " on host ", t.host,
           ": no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES), or set device_config.device "
           "to \"cpu\"");
  if (t.local_size > t.visible_gpus) {
    MT_CHECK(share_gpus, "host ", t.host, " runs ", t.local_size, " ranks but sees only ", t.visible_gpus,
             " GPU(s) (CUDA_VISIBLE_DEVICES applies): NCCL needs one GPU per rank. Start at most ",
             t.visible_gpus, " ranks per host (mpirun --map-by ppr:", t.visible_gpus,
             ":node), or set device_config.collectives to \"mpi\" to share GPUs (slow, for tests)");
    return t.local_rank % t.visible_gpus;
  }
  return t.local_rank;
}

std::string physical_gpu_id(const char* cuda_visible_devices, int index) {
  if (cuda_visible_devices == nullptr) return std::to_string(index);
  std::vector<std::string> entries(1);
  for (const char* c = cuda_visible_devices; *c != '\0'; ++c) {
    if (*c == ',')
      entries.emplace_back();
    else if (*c != ' ')
      entries.back() += *c;
  }
  if (index >= 0 && index < static_cast<int>(entries.size()) && !entries[static_cast<size_t>(index)].empty())
    return entries[static_cast<size_t>(index)];
  return std::to_string(index);
}

#ifdef MESHTRAIN_CUDA

int visible_cuda_devices() { return static_cast<int>(c10::cuda::device_count()); }

at::Device use_cuda_device(int index) {
  const int n = visible_cuda_devices();
  MT_CHECK(index >= 0 && index < n, "CUDA device ", index, " does not exist (this process sees ", n, ")");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "unknown";
  return prop.name;
}

#else

int visible_cuda_devices() { return 0; }

at::Device use_cuda_device(int index) {
  MT_FAIL("CUDA device ", index, " requested but meshtrain was built without CUDA (rebuild with MESHTRAIN_CUDA=1)");
}

std::string cuda_device_name(int /*index*/) { return ""; }

#endif

}  // namespace meshtrain
