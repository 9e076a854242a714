#include "meshtrain/parallel/fsdp.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include <array>
#include <map>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/flat_slices.h"
#include "gradient_sums.h"

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

// A weight's cast, made by the gather instead of by the layer: forward hands
// out the gathered compute-dtype tensor, backward is the cast's (the
// gradient in fp32, into the fp32 parameter), as at::_to_copy's would be.
class GatherCast : public torch::autograd::Function<GatherCast> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& /*param*/,
                            const at::Tensor& cast) {
    return cast.view_as(cast);  // shares the gathered memory (refilled before backward)
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grad) {
    return {grad[0].to(at::kFloat), at::Tensor()};
  }
};

c10::Stream current_stream(const c10::Device& d) { return c10::impl::VirtualGuardImpl(d.type()).getStream(d); }

// Work issued while it lives goes to `side` (CUDA), after everything the
// compute stream holds so far; nothing without a side stream (CPU).
class OnSide {
 public:
  explicit OnSide(const std::optional<c10::Stream>& side) {
    if (!side) return;
    c10::Event before(side->device_type());
    before.record(current_stream(side->device()));
    before.block(*side);
    guard_.emplace(*side);
  }

 private:
  std::optional<c10::StreamGuard> guard_;
};

}  // namespace

at::Tensor owned_slice(const ParallelModel& pm, const Fsdp::Flat& f) {
  std::vector<at::Tensor> whole;
  for (const ParamInfo& p : pm.params) whole.push_back(p.tensor.detach());
  return slice_of(pm, f.params, f.offsets, f.begin, f.slice, whole, f.grad.options());
}

Fsdp::Fsdp(ParallelModel& pm, Mesh& mesh, int stage, bool keep_gathered)
    : pm_(pm), mesh_(mesh), stage_(stage), keep_(keep_gathered) {
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
  // Stage 3 under mixed precision: a layer's compute_cast weights get flats
  // of their own, gathered in the compute dtype.
  const at::ScalarType compute = pm.model->precision().policy().compute;
  const bool split = stage == 3 && compute != at::kFloat;
  // [unit][0: dense fp32, 1: dense compute, 2: experts fp32, 3: experts compute]
  std::vector<std::array<std::vector<size_t>, 4>> spaces(units_.size());
  for (size_t i = 0; i < pm.params.size(); ++i) {
    ParamInfo& p = pm.params[i];
    // Non-trainable state (the router's selection bias) stays whole and replicated.
    if (!p.tensor.requires_grad()) continue;
    const int64_t layer = layer_of(p.path);
    const auto it = unit_of.find(layer);
    MT_ASSERT(layer < 0 || it != unit_of.end(), "parameter '", p.path, "' belongs to layer ", layer,
              " which is not on this pipeline stage");
    const size_t u = layer < 0 ? 0 : it->second;
    // The root unit (embedding, head) is gathered once per step: fp32.
    const bool cast = split && u != 0 && p.layout.compute_cast;
    spaces[u][(ep && p.layout.expert_split ? 2 : 0) + (cast ? 1 : 0)].push_back(i);
  }
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t k = 0; k < 4; ++k) {
      if (spaces[u][k].empty()) continue;
      units_[u].flats.emplace_back();
      units_[u].flats.back().params = spaces[u][k];
      init_flat(units_[u].flats.back(), k < 2 ? mesh.dp() : mesh.expert_dp(), k % 2 ? compute : at::kFloat);
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
        if (f.dtype == at::kFloat) continue;
        f.gathered = at::empty({f.padded}, f.shard.options().dtype(f.dtype));
        for (size_t j = 0; j < f.params.size(); ++j) {
          const at::Tensor& t = pm_.params[f.params[j]].tensor;
          f.casts.push_back(f.gathered.narrow(0, f.offsets[j], t.numel()).view(t.sizes()));
        }
      }
    release_all();
  }
  const at::Device device = pm.params.front().tensor.device();
  if (device.is_cuda()) side_ = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
}

void Fsdp::init_flat(Flat& f, Communicator& comm, at::ScalarType dtype) {
  f.comm = &comm;
  f.dtype = dtype;
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

void Fsdp::launch_gather(Unit& u) {
  if (u.whole || u.masters) return;
  at::NoGradGuard no_grad;
  // Made on the compute stream, which reads them; written on the side stream.
  std::vector<at::Tensor> targets;
  for (Flat& f : u.flats) {
    if (f.dtype != at::kFloat) targets.push_back(f.gathered);
    for (size_t i : f.params)
      if (f.dtype == at::kFloat) targets.push_back(pm_.params[i].tensor);
  }
  for (const at::Tensor& t : targets) alloc_storage(t);
  {
    OnSide on_side(side_);
    for (Flat& f : u.flats) {
      // The bf16 slice is the cast of the fp32 one, so the gathered weights
      // are bit for bit the casts of the whole fp32 weights.
      const at::Tensor part = f.dtype == at::kFloat ? f.shard : f.shard.to(f.dtype);
      const at::Tensor all = f.comm->size() > 1 ? f.comm->all_gather(part, 0) : part;
      if (f.dtype != at::kFloat) {
        // Into the one buffer the casts view (and backward's saved tensors),
        // under a fresh version counter (see below).
        f.gathered.variable_data().copy_(all);
        continue;
      }
      for (size_t j = 0; j < f.params.size(); ++j) {
        const at::Tensor& t = pm_.params[f.params[j]].tensor;
        // variable_data(): the same storage under a fresh version counter, so
        // refilling it does not look like an in-place change to the graph.
        t.variable_data().copy_(all.narrow(0, f.offsets[j], t.numel()).view(t.sizes()));
      }
    }
    if (side_) {
      for (const at::Tensor& t : targets) t.record_stream(*side_);
      u.ready.emplace(side_->device_type());
      u.ready->record(*side_);
    }
  }
  u.whole = true;
}

void Fsdp::gather(Unit& u) {
  launch_gather(u);
  if (u.ready) {
    u.ready->block(current_stream(side_->device()));
    u.ready.reset();
  }
}

void Fsdp::prefetch(size_t from, size_t next) {
  if (next == 0 || next >= units_.size()) return;
  const int64_t step = units_[next].layer - units_[from].layer;
  if (step == 1 || step == -1) launch_gather(units_[next]);
}

void Fsdp::release(Unit& u) {
  if (stage_ != 3 || !(u.whole || u.masters)) return;
  if (u.ready) {
    // A prefetched gather never used: its memory may go once it is done.
    u.ready->block(current_stream(side_->device()));
    u.ready.reset();
  }
  for (Flat& f : u.flats) {
    if (f.gathered.defined()) free_storage(f.gathered);
    for (size_t i : f.params) free_storage(pm_.params[i].tensor);  // (no-op where never filled)
  }
  u.whole = false;
  u.masters = false;
}

void Fsdp::wait_side() {
  if (!side_) return;
  c10::Event done(side_->device_type());
  done.record(*side_);
  done.block(current_stream(side_->device()));
}

void Fsdp::before_layer(size_t block) {
  MT_ASSERT(block + 1 < units_.size(), "FSDP: block ", block, " outside this stage's ", units_.size() - 1);
  Unit& u = units_[block + 1];
  gather(u);
  prefetch(block + 1, block + 2);
  // The layer's bf16 weight casts are made anew inside this forward. A cast
  // cached by an earlier microbatch of the round is an autograd node older
  // than everything of this microbatch: the engine, which runs the newest
  // ready node first, would accumulate this layer's weight gradients only
  // after the previous layer's output hook reduce-scattered and freed them
  // (see fsdp.h), and they were lost (issue 27: zero_stage 2/3 with several
  // microbatches in bf16, grad norm 11% low). The gathered casts get a fresh
  // node here for the same reason.
  MixedPrecision& mp = pm_.model->precision();
  const bool grad = at::GradMode::is_enabled();
  for (Flat& f : u.flats)
    for (size_t j = 0; j < f.params.size(); ++j) {
      const at::Tensor& t = pm_.params[f.params[j]].tensor;
      mp.forget(t);
      if (f.dtype == at::kFloat || u.masters) continue;  // cast from the fp32 weight by the layer
      mp.provide(t, grad && t.requires_grad() ? GatherCast::apply(t, f.casts[j]) : f.casts[j]);
    }
}

at::Tensor Fsdp::after_layer(size_t block, at::Tensor out) {
  if (at::GradMode::is_enabled() && out.requires_grad())
    out.register_hook([this, block](const at::Tensor&) { pre_backward(block + 1); });
  // keep_gathered: the step's next microbatches and backward passes reuse it.
  if (!(keep_ && at::GradMode::is_enabled())) release(units_[block + 1]);
  return out;
}

void Fsdp::before_root() { gather(units_[0]); }

void Fsdp::pre_backward(size_t unit) {
  // keep_gathered: the gradients accumulate whole until reduce_root().
  if (keep_) {
    gather(units_[unit]);
    prefetch(unit, unit - 1);
    return;
  }
  // The units whose backward started earlier in this pass are done (see fsdp.h).
  std::vector<size_t> done;
  done.swap(in_backward_);
  for (size_t k : done) backward_done(k);
  gather(units_[unit]);
  prefetch(unit, unit - 1);
  in_backward_.push_back(unit);
  if (!callback_queued_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
}

void Fsdp::backward_done(size_t k) {
  // A zero-bubble B pass queued the unit's weight-gradient GEMMs: its
  // reduce-scatter follows their W (the gathered weights are not needed
  // there: W multiplies the saved activations by the output gradients).
  if (WeightGradQueue* w = pm_.model->precision().deferred_weight_grads()) {
    release(units_[k]);
    w->after_run([this, k] { reduce_unit(units_[k], true); });
    return;
  }
  reduce_unit(units_[k], true);
}

void Fsdp::finish_backward() {
  callback_queued_ = false;
  std::vector<size_t> done;
  done.swap(in_backward_);
  for (size_t k : done) backward_done(k);
  // Whatever runs after backward (statistics, norms) may use the same
  // communicators: their collectives follow FSDP's in stream order.
  wait_side();
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
    OnSide on_side(side_);
    if (side_) flat.record_stream(*side_);
    f.grad.add_(f.comm->size() > 1 ? f.comm->reduce_scatter(flat, 0) : flat);
  }
  release(u);
}

void Fsdp::reduce_root() {
  MT_ASSERT(in_backward_.empty(), "FSDP: ", in_backward_.size(), " layers still wait for their gradient reduction");
  wait_side();  // a zero-bubble W's reduce-scatters (backward_done) ran on the side stream
  // keep_gathered: the layers' whole gradients, summed over the step, once
  // each, last layer first (as backward would have).
  if (keep_)
    for (size_t u = units_.size(); u-- > 1;) reduce_unit(units_[u], true);
  reduce_unit(units_[0], false);
  wait_side();
}

void Fsdp::gather_all() {
  at::NoGradGuard no_grad;
  for (Unit& u : units_) {
    if (u.masters) continue;
    // The fp32 weights themselves, also those gathered in the compute dtype for compute.
    release(u);
    for (Flat& f : u.flats) {
      const at::Tensor all = f.comm->size() > 1 ? f.comm->all_gather(f.shard, 0) : f.shard;
      for (size_t j = 0; j < f.params.size(); ++j) {
        const at::Tensor& t = pm_.params[f.params[j]].tensor;
        alloc_storage(t);
        t.variable_data().copy_(all.narrow(0, f.offsets[j], t.numel()).view(t.sizes()));
      }
    }
    u.masters = true;
  }
}

void Fsdp::params_written() {
  if (stage_ != 3) return;
  at::NoGradGuard no_grad;
  for (Unit& u : units_) {
    MT_ASSERT(u.masters, "FSDP: parameters written while not whole (call gather_params() first)");
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

namespace {

Fsdp* fsdp_of(ParallelModel& pm) { return pm.data_parallel ? pm.data_parallel->fsdp() : nullptr; }

}  // namespace

void gather_params(ParallelModel& pm) {
  if (Fsdp* f = fsdp_of(pm)) f->gather_all();
}

void release_params(ParallelModel& pm, bool written) {
  Fsdp* f = fsdp_of(pm);
  if (!f) return;
  if (written) f->params_written();
  f->release_all();
}

}  // namespace meshtrain
