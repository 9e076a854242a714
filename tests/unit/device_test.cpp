// GPU selection per rank (dist/device.h) on mocked host topologies: which GPU
// each local rank takes, the error when a host has more ranks than GPUs, GPU
// sharing under collectives "mpi", and CUDA_VISIBLE_DEVICES naming.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/dist/device.h"

namespace meshtrain {
namespace {

NodeTopology host(int local_rank, int local_size, int gpus, int world_rank = 0) {
  return NodeTopology{"node-a", world_rank, local_rank, local_size, gpus};
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

TEST(DeviceSelection, EachLocalRankTakesItsOwnGpu) {
  // Two hosts of 8 ranks on 8 GPUs: world ranks 0..15, local ranks 0..7 each.
  for (int world = 0; world < 16; ++world) {
    const int local = world % 8;
    EXPECT_EQ(cuda_device_index(host(local, 8, 8, world), false), local) << "world rank " << world;
  }
  // Fewer ranks than GPUs: the first ones are used.
  std::set<int> used;
  for (int local = 0; local < 3; ++local) used.insert(cuda_device_index(host(local, 3, 8), false));
  EXPECT_EQ(used, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(cuda_device_index(host(0, 1, 1), false), 0);
}

// srun --gpus-per-task=1 / CUDA_VISIBLE_DEVICES per rank: 8 ranks on a host,
// each seeing one GPU, each takes its GPU 0 (with or without sharing).
TEST(DeviceSelection, OneVisibleGpuPerRankTakesThatGpu) {
  for (int local = 0; local < 8; ++local) {
    EXPECT_EQ(cuda_device_index(host(local, 8, 1, 8 + local), false), 0) << "local rank " << local;
    EXPECT_EQ(cuda_device_index(host(local, 8, 1, 8 + local), true), 0);
  }
}

std::vector<RankGpu> two_hosts(const std::vector<std::string>& uuids_a, const std::vector<std::string>& uuids_b) {
  std::vector<RankGpu> out;
  for (const auto& u : uuids_a) out.push_back({static_cast<int>(out.size()), "node-a", u});
  for (const auto& u : uuids_b) out.push_back({static_cast<int>(out.size()), "node-b", u});
  return out;
}

TEST(DeviceSelection, RanksOnAHostMustDriveDifferentGpus) {
  // One GPU per rank, different on each rank; the same UUIDs on another host
  // are other GPUs (UUIDs are per host here only to show hosts are separate).
  const std::vector<std::string> eight{"GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-4", "GPU-5", "GPU-6", "GPU-7"};
  EXPECT_NO_THROW(check_one_gpu_per_rank(two_hosts(eight, eight), false));
  EXPECT_NO_THROW(check_one_gpu_per_rank({}, false));
  // A launcher that left every rank of node-b on the same GPU.
  const std::string msg = error_of(
      [&] { check_one_gpu_per_rank(two_hosts(eight, {"GPU-9", "GPU-9", "GPU-8", "GPU-9"}), false); });
  for (const char* part : {"ranks 8, 9, 11", "node-b", "GPU-9", "one GPU per rank", "collectives"})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  EXPECT_EQ(msg.find("node-a"), std::string::npos) << msg;
  // collectives "mpi" may share GPUs.
  EXPECT_NO_THROW(check_one_gpu_per_rank(two_hosts({"GPU-0", "GPU-0"}, {}), true));
}

TEST(DeviceSelection, MoreRanksThanGpusIsAClearError) {
  const std::string msg = error_of([] { cuda_device_index(host(5, 8, 4, 13), false); });
  for (const char* part : {"node-a", "8 ranks", "4 GPU", "CUDA_VISIBLE_DEVICES", "collectives"})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

TEST(DeviceSelection, MpiCollectivesShareGpusRoundRobin) {
  EXPECT_EQ(cuda_device_index(host(5, 8, 2), true), 1);
  EXPECT_EQ(cuda_device_index(host(6, 8, 4), true), 2);
  // Enough GPUs: sharing changes nothing.
  EXPECT_EQ(cuda_device_index(host(3, 4, 4), true), 3);
}

TEST(DeviceSelection, NoVisibleGpuOrBadTopologyIsAnError) {
  const std::string none = error_of([] { cuda_device_index(host(0, 1, 0), true); });
  EXPECT_NE(none.find("no CUDA device is visible"), std::string::npos) << none;
  EXPECT_NE(none.find("node-a"), std::string::npos) << none;
  const std::string bad = error_of([] { cuda_device_index(host(4, 4, 8), false); });
  EXPECT_NE(bad.find("local rank 4"), std::string::npos) << bad;
}

TEST(DeviceSelection, PhysicalIdFollowsCudaVisibleDevices) {
  EXPECT_EQ(physical_gpu_id(nullptr, 3), "3");
  EXPECT_EQ(physical_gpu_id("4,5,6,7", 0), "4");
  EXPECT_EQ(physical_gpu_id("4, 5,6,7", 1), "5");
  EXPECT_EQ(physical_gpu_id("GPU-8f2a,GPU-77c1", 1), "GPU-77c1");
  EXPECT_EQ(physical_gpu_id("2", 1), "1");  // shorter than the index: the index
  EXPECT_EQ(physical_gpu_id("", 0), "0");
}

TEST(DeviceSelection, UseCudaDeviceRefusesMissingDevices) {
  const int n = visible_cuda_devices();
#ifdef MESHTRAIN_CUDA
  // One past the last visible device (device 0 on a machine without a GPU).
  const std::string msg = error_of([n] { use_cuda_device(n); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  EXPECT_FALSE(nccl_runtime_version().empty());
  // nvidia-smi's UUID form: "GPU-" and 8-4-4-4-12 hex digits.
  if (n > 0) EXPECT_EQ(cuda_device_uuid(0).size(), 40u) << cuda_device_uuid(0);
#else
  EXPECT_EQ(cuda_device_uuid(0), "");
  EXPECT_EQ(n, 0);
  const std::string msg = error_of([] { use_cuda_device(0); });
  EXPECT_NE(msg.find("built without CUDA"), std::string::npos) << msg;
  EXPECT_EQ(nccl_runtime_version(), "");
#endif
}

}  // namespace
}  // namespace meshtrain
