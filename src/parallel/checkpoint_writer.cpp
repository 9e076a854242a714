#include "meshtrain/parallel/checkpoint_writer.h"

#include <torch/torch.h>

#include <algorithm>

#ifdef MESHTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/fsdp.h"

namespace meshtrain {

HostCopies::HostCopies(int64_t gather_bytes) : gather_bytes_(gather_bytes) {
  MT_CHECK(gather_bytes > 0, "checkpoint gather chunk must be positive, got ", gather_bytes, " bytes");
}

at::Tensor HostCopies::add(const at::Tensor& t) {
  MT_ASSERT(t.defined(), "HostCopies::add of an undefined tensor");
  if (t.device().is_cpu()) {
    host_bytes_ += static_cast<int64_t>(t.nbytes());
    return t;
  }
  at::Tensor h = empty(t.sizes(), t.scalar_type(), t.device());
  copy(h, t);
  return h;
}

at::Tensor HostCopies::empty(at::IntArrayRef shape, at::ScalarType dtype, const at::Device& from) {
  // Pinned pages let the device copy run asynchronously (pageable memory
  // would make every copy a synchronous staging through a driver buffer).
  at::Tensor h = at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kCPU).pinned_memory(from.is_cuda()));
  host_bytes_ += static_cast<int64_t>(h.nbytes());
  return h;
}

void HostCopies::copy(const at::Tensor& dst, const at::Tensor& src) {
  if (src.device().is_cpu()) {
    dst.copy_(src);
    return;
  }
  // Cast on the device, so what crosses the bus is what is written.
  const at::Tensor s = src.scalar_type() == dst.scalar_type() ? src : src.to(dst.scalar_type());
  dst.copy_(s, /*non_blocking=*/true);
  copied_bytes_ += static_cast<int64_t>(dst.nbytes());
  pending_ = true;
  device_ = src.device();
}

void HostCopies::wait() {
  if (!pending_) return;
#ifdef MESHTRAIN_CUDA
  // The copies were queued on the current stream behind the kernels and
  // collectives that produced their sources; device buffers freed meanwhile
  // are only reused by later work on that same stream.
  c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
  pending_ = false;
}

bool group_writes_checkpoint(const ParamLayout& l, const Mesh& mesh) {
  return !l.tied_copy && (l.split_dim >= 0 || mesh.coord().tp == 0);
}

bool writes_checkpoint(const ParamLayout& l, const Mesh& mesh) {
  const auto& c = mesh.coord();
  const bool first_holder = l.expert_split ? c.dp < mesh.shape().ep : c.dp == 0;
  return first_holder && group_writes_checkpoint(l, mesh);
}

void gather_to_writer(const ParallelModel& pm, const std::vector<size_t>& params,
                      const std::vector<int64_t>& offsets, const std::vector<bool>& written,
                      const at::Tensor& local, Communicator& comm, bool in_param_dtype, HostCopies& host,
                      std::vector<at::Tensor>& out) {
  MT_ASSERT(params.size() == offsets.size() && params.size() == written.size(), "gather_to_writer: ", params.size(),
            " params, ", offsets.size(), " offsets, ", written.size(), " written flags");
  const int64_t size = comm.size(), slice = local.numel();
  const bool root = comm.rank() == 0;
  const auto numel = [&](size_t j) { return pm.params[params[j]].tensor.numel(); };
  const auto dtype = [&](size_t j) {
    return in_param_dtype ? pm.params[params[j]].tensor.scalar_type() : local.scalar_type();
  };
  if (size == 1) {  // the writer holds everything: nothing to gather
    for (size_t j = 0; j < params.size(); ++j) {
      if (!written[j]) continue;
      const at::Tensor& p = pm.params[params[j]].tensor;
      out[params[j]] = host.add(local.narrow(0, offsets[j], numel(j)).view(p.sizes()).to(dtype(j)));
    }
    return;
  }
  // Flat host views of the tensors the root assembles.
  std::vector<at::Tensor> flat(params.size());
  if (root)
    for (size_t j = 0; j < params.size(); ++j) {
      if (!written[j]) continue;
      const at::Tensor& p = pm.params[params[j]].tensor;
      out[params[j]] = host.empty(p.sizes(), dtype(j), local.device());
      flat[j] = out[params[j]].view({-1});
    }
  const int64_t chunk = std::max<int64_t>(1, host.gather_bytes() / (size * static_cast<int64_t>(local.element_size())));
  for (int64_t a = 0; a < slice; a += chunk) {
    const int64_t len = std::min(chunk, slice - a);
    // Rank r's piece covers [r*slice + a, r*slice + a + len) of the space;
    // every rank of the group decides alike whether any of it is written.
    std::vector<std::pair<size_t, int64_t>> hits;  // (param j, rank r)
    for (int64_t r = 0; r < size; ++r) {
      const int64_t lo = r * slice + a, hi = lo + len;
      for (size_t j = 0; j < params.size(); ++j)
        if (written[j] && offsets[j] < hi && offsets[j] + numel(j) > lo) hits.emplace_back(j, r);
    }
    if (hits.empty()) continue;
    const at::Tensor got = comm.gather(local.narrow(0, a, len), 0);
    if (!root) continue;
    for (const auto& [j, r] : hits) {
      const int64_t lo = std::max(offsets[j], r * slice + a), hi = std::min(offsets[j] + numel(j), r * slice + a + len);
      host.copy(flat[j].narrow(0, lo - offsets[j], hi - lo), got.narrow(0, r * len + lo - (r * slice + a), hi - lo));
    }
  }
}

std::vector<at::Tensor> params_to_save(ParallelModel& pm, const Mesh& mesh, HostCopies& host) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out(pm.params.size());
  Fsdp* fsdp = pm.data_parallel ? pm.data_parallel->fsdp() : nullptr;
  const bool sharded = fsdp && fsdp->stage() == 3;
  std::vector<bool> in_unit(pm.params.size(), false);
  if (sharded)
    for (Fsdp::Unit& u : fsdp->units())
      for (Fsdp::Flat& f : u.flats) {
        std::vector<bool> written;
        for (size_t i : f.params) {
          in_unit[i] = true;
          written.push_back(group_writes_checkpoint(pm.params[i].layout, mesh));
        }
        gather_to_writer(pm, f.params, f.offsets, written, f.shard, *f.comm, /*in_param_dtype=*/true, host, out);
      }
  // Whole parameters (every stage below 3; non-trainable ones under stage 3).
  for (size_t i = 0; i < pm.params.size(); ++i)
    if (!in_unit[i] && writes_checkpoint(pm.params[i].layout, mesh)) out[i] = host.add(pm.params[i].tensor.detach());
  return out;
}

}  // namespace meshtrain
