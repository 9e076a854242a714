// GPU selection per rank; see meshtrain/dist/device.h.
#include "meshtrain/dist/device.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/core/check.h"

#ifdef MESHTRAIN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cstdio>
#include <cuda_runtime_api.h>
#endif

namespace meshtrain {

int cuda_device_index(const NodeTopology& t, bool share_gpus) {
  MT_CHECK(t.local_size >= 1 && t.local_rank >= 0 && t.local_rank < t.local_size, "rank ", t.world_rank,
           " on host ", t.host, ": local rank ", t.local_rank, " is outside the host's ", t.local_size, " ranks");
  MT_CHECK(t.visible_gpus > 0, "rank ", t.world_rank, " on host ", t.host,
           ": no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES), or set device_config.device "
           "to \"cpu\"");
  // One GPU per rank from the launcher; check_one_gpu_per_rank then tells it
  // from ranks all seeing the same single GPU.
  if (t.visible_gpus == 1) return 0;
  if (t.local_size > t.visible_gpus) {
    MT_CHECK(share_gpus, "host ", t.host, " runs ", t.local_size, " ranks but sees only ", t.visible_gpus,
             " GPU(s) (CUDA_VISIBLE_DEVICES applies): NCCL needs one GPU per rank. Start at most ",
             t.visible_gpus, " ranks per host (mpirun --map-by ppr:", t.visible_gpus,
             ":node), or set device_config.collectives to \"mpi\" to share GPUs (slow, for tests)");
    return t.local_rank % t.visible_gpus;
  }
  return t.local_rank;
}

void check_one_gpu_per_rank(const std::vector<RankGpu>& ranks, bool share_gpus) {
  if (share_gpus) return;
  std::map<std::pair<std::string, std::string>, std::vector<int>> users;  // (host, uuid) -> world ranks
  for (const RankGpu& r : ranks) users[{r.host, r.uuid}].push_back(r.world_rank);
  for (const auto& [key, who] : users) {
    if (who.size() < 2) continue;
    std::string list;
    for (int r : who) list += (list.empty() ? "" : ", ") + std::to_string(r);
    MT_FAIL("ranks ", list, " on host ", key.first, " all drive GPU ", key.second,
            ": NCCL needs one GPU per rank. Give each rank its own GPU (CUDA_VISIBLE_DEVICES per rank, srun "
            "--gpus-per-task=1, or all GPUs visible to every rank and at most one rank per GPU: mpirun --map-by "
            "ppr:<GPUs>:node), or set device_config.collectives to \"mpi\" to share GPUs (slow, for tests)");
  }
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

int64_t cuda_device_memory(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return 0;
  return static_cast<int64_t>(prop.totalGlobalMem);
}

std::string cuda_device_uuid(int index) {
  cudaDeviceProp prop{};
  MT_CHECK(cudaGetDeviceProperties(&prop, index) == cudaSuccess, "CUDA device ", index,
           ": cannot read its properties (UUID)");
  // nvidia-smi's form: GPU-8-4-4-4-12 hex digits.
  static constexpr int kGroups[] = {4, 2, 2, 2, 6};
  std::string out = "GPU-";
  int byte = 0;
  for (int g = 0; g < 5; ++g) {
    if (g > 0) out += '-';
    for (int i = 0; i < kGroups[g]; ++i, ++byte) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(prop.uuid.bytes[byte]));
      out += hex;
    }
  }
  return out;
}

#else

int visible_cuda_devices() { return 0; }

at::Device use_cuda_device(int index) {
  MT_FAIL("CUDA device ", index, " requested but meshtrain was built without CUDA (rebuild with MESHTRAIN_CUDA=1)");
}

std::string cuda_device_name(int /*index*/) { return ""; }

std::string cuda_device_uuid(int /*index*/) { return ""; }

int64_t cuda_device_memory(int /*index*/) { return 0; }

#endif

}  // namespace meshtrain
