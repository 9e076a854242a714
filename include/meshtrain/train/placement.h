#pragma once
// Where a rank runs: its device (the GPU its local rank maps to, dist/device.h),
// the collective backend that device calls for, and the checks and log lines
// that make a wrong placement visible before any NCCL communicator exists.
#include <c10/core/Device.h>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/dist/runtime.h"

namespace meshtrain {

// CUDA: the GPU of this local rank, made current before any other CUDA or
// NCCL call; meta (bench --device meta): the meta device; else the CPU.
at::Device pick_device(const Config& cfg, const Runtime& rt, bool meta);
// device_config.collectives for this device: NCCL moves CUDA tensors only.
Backend pick_backend(const Config& cfg, const at::Device& device);
// The ranks of one host must drive different GPUs (compared by UUID, since a
// launcher giving each rank one visible GPU makes every rank call it GPU 0).
// Collective over world.
void check_gpu_per_rank(Communicator& world, const Config& cfg, const at::Device& device);
// One line per rank, printed by rank 0 in rank order: where each rank runs.
void log_placement(Mesh& mesh, const Runtime& rt, const at::Device& device);

}  // namespace meshtrain
