#include "meshtrain/parallel/fsdp.h"

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/flat_slices.h"

namespace meshtrain {

namespace {

// "layers.12.attn.wq.weight" -> 12; anything else (the root unit's) -> -1.
int64_t layer_of(const std::string& path) {
  const std::string prefix = "layers.";
  if (path.compare(0, prefix.size(), prefix) != 0) return -1;
  return std::stoll(path.substr(prefix.size(), path.find('.', prefix.size()) - prefix.size()));
}

// A parameter's memory is emptied in place, so the tensor, the module and
// the autograd graph's saved references to it stay valid; refilling the same
// storage before backward brings the values back where the graph looks (as
// PyTorch FSDP frees its unsharded parameters).
void free_storage(const at::Tensor& t) {
  if (t.is_meta()) return;  // the performance model's tensors have no memory
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void alloc_storage(const at::Tensor& t) {
  if (t.is_meta()) return;
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
  if (s->nbytes() == n) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(n));
  s->set_nbytes(n);
}

}  // namespace

at::Tensor owned_slice(const ParallelModel& pm, const Fsdp::Flat& f) {
  std::vector<at::Tensor> whole;
  for (const ParamInfo& p : pm.params) whole.push_back(p.tensor.detach());
  return slice_of(pm, f.params, f.offsets, f.begin, f.slice, whole, f.grad.options());
}

Fsdp::Fsdp(ParallelModel& pm, Mesh& mesh, int stage) : pm_(pm), mesh_(mesh), stage_(stage) {
  MT_CHECK(stage == 2 || stage == 3, "FSDP runs zero_stage 2 or 3, got ", stage);
  MT_CHECK(!pm.params.empty(), "zero_stage ", stage, ": this rank has no parameters");
  at::NoGradGuard no_grad;
  const std::vector<int64_t> layers = pm.range.layers();
  std::map<int64_t, size_t> unit_of;
  units_.resize(layers.size() + 1);
  for (size_t j = 0; j < layers.size(); ++j) {
    units_[j + 1].layer = layers[j];
    unit_of[layers[j]] = j + 1;
  }
  const bool ep = mesh.shape().ep > 1;
  std::vector<std::vector<size_t>> dense(units_.size()), experts(units_.size());
  for (size_t i = 0; i < pm.params.size(); ++i) {
    ParamInfo& p = pm.params[i];
    // Non-trainable state (the router's selection bias) stays whole and replicated.
    if (!p.tensor.requires_grad()) continue;
    const int64_t layer = layer_of(p.path);
    const auto it = unit_of.find(layer);
    MT_ASSERT(layer < 0 || it != unit_of.end(), "parameter '", p.path, "' belongs to layer ", layer,
              " which is not on this pipeline stage");
    const size_t u = layer < 0 ? 0 : it->second;
    (ep && p.layout.expert_split ? experts : dense)[u].push_back(i);
    p.fsdp_reduced = u != 0;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!dense[u].empty()) {
      units_[u].flats.emplace_back();
      units_[u].flats.back().params = dense[u];
      init_flat(units_[u].flats.back(), mesh.dp());
    }
    if (!experts[u].empty()) {
      units_[u].flats.emplace_back();
      units_[u].flats.back().params = experts[u];
      init_flat(units_[u].flats.back(), mesh.expert_dp());
    }
  }
  if (stage_ == 3) {
    for (Unit& u : units_)
      for (Flat& f : u.flats) {
        f.shard = owned_slice(pm_, f);
        // Each parameter must own exactly its storage to be freed alone.
        for (size_t i : f.params) {
          at::Tensor& t = pm_.params[i].tensor;
          if (!t.is_contiguous() || t.storage_offset() != 0 ||
              t.storage().nbytes() != static_cast<size_t>(t.numel()) * t.element_size())
            t.set_data(t.detach().clone(at::MemoryFormat::Contiguous));
        }
      }
    release_all();
  }
}

void Fsdp::init_flat(Flat& f, Communicator& comm) {
  f.comm = &comm;
  for (size_t i : f.params) {
    f.offsets.push_back(f.numel);
    f.numel += pm_.params[i].tensor.numel();
  }
  const int64_t size = comm.size();
  f.padded = (f.numel + size - 1) / size * size;
  f.slice = f.padded / size;
  f.begin = comm.rank() * f.slice;
  const auto opts = pm_.params.front().tensor.options().dtype(at::kFloat).requires_grad(false);
  f.grad = at::zeros({f.slice}, opts);
}

void Fsdp::gather(Unit& u) {
  if (u.whole) return;
  at::NoGradGuard no_grad;
  for (Flat& f : u.flats) {
    const at::Tensor all = f.comm->size() > 1 ? f.comm->all_gather(f.shard, 0) : f.shard;
    for (size_t j = 0; j < f.params.size(); ++j) {
      const at::Tensor& t = pm_.params[f.params[j]].tensor;
      alloc_storage(t);
      // variable_data(): the same storage under a fresh version counter, so
      // refilling it does not look like an in-place change to the graph.
      t.variable_data().copy_(all.narrow(0, f.offsets[j], t.numel()).view(t.sizes()));
    }
  }
  u.whole = true;
}

void Fsdp::release(Unit& u) {
  if (stage_ != 3 || !u.whole) return;
  for (Flat& f : u.flats)
    for (size_t i : f.params) free_storage(pm_.params[i].tensor);
  u.whole = false;
}

void Fsdp::before_layer(size_t block) {
  MT_ASSERT(block + 1 < units_.size(), "FSDP: block ", block, " outside this stage's ", units_.size() - 1);
  Unit& u = units_[block + 1];
  gather(u);
  // The layer's bf16 weight casts are made anew inside this forward. A cast
  // cached by an earlier microbatch of the round is an autograd node older
  // than everything of this microbatch: the engine, which runs the newest
  // ready node first, would accumulate this layer's weight gradients only
  // after the previous layer's output hook reduce-scattered and freed them
  // (see fsdp.h), and they were lost (issue 27: zero_stage 2/3 with several
  // microbatches in bf16, grad norm 11% low).
  for (Flat& f : u.flats)
    for (size_t i : f.params) pm_.model->precision().forget(pm_.params[i].tensor);
}

at::Tensor Fsdp::after_layer(size_t block, at::Tensor out) {
  if (at::GradMode::is_enabled() && out.requires_grad())
    out.register_hook([this, block](const at::Tensor&) { pre_backward(block + 1); });
  release(units_[block + 1]);
  return out;
}

void Fsdp::before_root() { gather(units_[0]); }

void Fsdp::pre_backward(size_t unit) {
  // The units whose backward started earlier in this pass are done (see fsdp.h).
  std::vector<size_t> done;
  done.swap(in_backward_);
  for (size_t k : done) reduce_unit(units_[k], true);
  gather(units_[unit]);
  in_backward_.push_back(unit);
  if (!callback_queued_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
}

void Fsdp::finish_backward() {
  callback_queued_ = false;
  std::vector<size_t> done;
  done.swap(in_backward_);
  for (size_t k : done) reduce_unit(units_[k], true);
}

void Fsdp::reduce_unit(Unit& u, bool tp) {
  at::NoGradGuard no_grad;
  // A parameter without a gradient (an expert that got no token) takes part
  // as zeros, so every rank reaches the same collectives.
  for (Flat& f : u.flats)
    for (size_t i : f.params) {
      at::Tensor& t = pm_.params[i].tensor;
      if (!t.grad().defined()) t.mutable_grad() = at::zeros_like(t);
    }
  if (tp && mesh_.shape().tp > 1) {
    std::vector<at::Tensor> sp;
    for (Flat& f : u.flats)
      for (size_t i : f.params)
        if (pm_.params[i].sequence_parallel_grad) sp.push_back(pm_.params[i].tensor.grad());
    all_reduce_flat(sp, mesh_.tp());
  }
  for (Flat& f : u.flats) {
    std::vector<at::Tensor> parts;
    for (size_t i : f.params) parts.push_back(pm_.params[i].tensor.grad().reshape({-1}).to(at::kFloat));
    if (f.padded > f.numel) parts.push_back(at::zeros({f.padded - f.numel}, f.grad.options()));
    at::Tensor flat = at::cat(parts);
    parts.clear();
    // The whole gradients are no longer needed: free them before the collective.
    for (size_t i : f.params) pm_.params[i].tensor.mutable_grad() = at::Tensor();
    f.grad.add_(f.comm->size() > 1 ? f.comm->reduce_scatter(flat, 0) : flat);
  }
  release(u);
}

void Fsdp::reduce_root() {
  MT_ASSERT(in_backward_.empty(), "FSDP: ", in_backward_.size(), " layers still wait for their gradient reduction");
  reduce_unit(units_[0], false);
}

void Fsdp::gather_all() {
  for (Unit& u : units_) gather(u);
}

void Fsdp::params_written() {
  if (stage_ != 3) return;
  at::NoGradGuard no_grad;
  for (Unit& u : units_) {
    MT_ASSERT(u.whole, "FSDP: parameters written while not whole (call gather_params() first)");
    for (Flat& f : u.flats) f.shard.copy_(owned_slice(pm_, f));
  }
}

void Fsdp::release_all() {
  for (Unit& u : units_) release(u);
}

void Fsdp::zero_grad() {
  at::NoGradGuard no_grad;
  for (Unit& u : units_)
    for (Flat& f : u.flats) f.grad.zero_();
}

void gather_params(ParallelModel& pm) {
  if (pm.fsdp) pm.fsdp->gather_all();
}

void release_params(ParallelModel& pm, bool written) {
  if (!pm.fsdp) return;
  if (written) pm.fsdp->params_written();
  pm.fsdp->release_all();
}

}  // namespace meshtrain
