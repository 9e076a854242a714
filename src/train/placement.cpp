// Where a rank runs (see placement.h).
#include "meshtrain/train/placement.h"

#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/core/host.h"
#include "meshtrain/core/log.h"
#include "meshtrain/dist/device.h"

namespace meshtrain {

namespace {

// Fixed-width rows of text gathered from every rank (rank order).
std::vector<std::string> gather_text(Communicator& world, std::string text) {
  constexpr int64_t kWidth = 256;
  text.resize(static_cast<size_t>(kWidth), '\0');
  const at::Tensor mine = at::from_blob(text.data(), {kWidth}, at::kByte).clone();
  const at::Tensor all = world.all_gather(mine, 0);
  std::vector<std::string> rows;
  for (int r = 0; r < world.size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * kWidth;
    rows.emplace_back(p, strnlen(p, static_cast<size_t>(kWidth)));
  }
  return rows;
}

}  // namespace

// The device of this rank: with CUDA, the GPU its local rank maps to
// (dist/device.h), made current before any other CUDA or NCCL call; the meta
// device for bench --device meta (shapes only, nothing computed).
at::Device pick_device(const Config& cfg, const Runtime& rt, bool meta) {
  if (meta) return at::Device(at::kMeta);
  const DeviceChoice d = cfg.device.device;
  if (d == DeviceChoice::Cpu) return at::Device(at::kCPU);
  const bool cuda = torch::cuda::is_available();
  MT_CHECK(d != DeviceChoice::Cuda || cuda, "device_config.device is \"cuda\" but no CUDA device is available to this build");
  if (!cuda) return at::Device(at::kCPU);
  NodeTopology topo{hostname(), rt.rank(), rt.local_rank(), rt.local_size(), visible_cuda_devices()};
  return use_cuda_device(cuda_device_index(topo, /*share_gpus=*/cfg.device.collectives == CollectivesChoice::Mpi));
}

Backend pick_backend(const Config& cfg, const at::Device& device) {
  const CollectivesChoice c = cfg.device.collectives;
  MT_CHECK(c != CollectivesChoice::Nccl || device.is_cuda(), "device_config.collectives is \"nccl\" but this rank runs on ", device.str(),
           ": NCCL moves CUDA tensors only (use \"auto\" or \"mpi\")");
  if (c == CollectivesChoice::Mpi) return Backend::Mpi;
  return device.is_cuda() ? Backend::Nccl : Backend::Mpi;
}

// Before any NCCL communicator exists: the ranks of one host must drive
// different GPUs (a launcher giving each rank one visible GPU must give each a
// different one). Compared by UUID, since every such rank calls its GPU 0.
void check_gpu_per_rank(Communicator& world, const Config& cfg, const at::Device& device) {
  const std::string uuid = device.is_cuda() ? cuda_device_uuid(device.index()) : "";
  const std::vector<std::string> rows = gather_text(world, hostname() + '\n' + uuid);
  std::vector<RankGpu> gpus;
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t nl = rows[r].find('\n');
    const std::string id = nl == std::string::npos ? "" : rows[r].substr(nl + 1);
    if (!id.empty()) gpus.push_back(RankGpu{static_cast<int>(r), rows[r].substr(0, nl), id});
  }
  check_one_gpu_per_rank(gpus, /*share_gpus=*/cfg.device.collectives == CollectivesChoice::Mpi);
}

// One line per rank, printed by rank 0 in rank order (other ranks log only
// warnings): where each rank runs, to spot two ranks on one GPU at a glance.
void log_placement(Mesh& mesh, const Runtime& rt, const at::Device& device) {
  std::string line = detail::concat("rank ", rt.rank(), " on ", hostname(), " (local ", rt.local_rank(), "/",
                                    rt.local_size(), "): mesh (dp ", mesh.coord().dp, ", pp ", mesh.coord().pp,
                                    ", tp ", mesh.coord().tp, ")");
  if (device.is_cuda()) {
    const int i = device.index();
    line += detail::concat(", GPU ", i, " (", cuda_device_name(i), ", physical id ",
                           physical_gpu_id(std::getenv("CUDA_VISIBLE_DEVICES"), i), ")");
  } else {
    line += ", cpu";
  }
  const std::vector<std::string> rows = gather_text(mesh.cpu_world(), line);
  if (mesh.cpu_world().rank() != 0) return;
  for (const std::string& row : rows) spdlog::info("{}", row);
}

}  // namespace meshtrain
