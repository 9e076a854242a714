// AdamW over FSDP's owned slices (zero_stage 2 and 3, parallel/fsdp.h). A step:
//   reduce_gradients()  the root unit's reduce-scatter (the layers' ran during
//                       backward) and the global norm from the owned slices
//   step(lr, .., c)     AdamW on the owned slices, clipped by c inside the
//                       fused update (the same update as
//                       zero_stage 0 and 1); stage 2 all-gathers them back
//                       into the whole parameters, stage 3 keeps them and
//                       frees the root unit gathered during the step.
#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/checkpoint_writer.h"
#include "meshtrain/parallel/flat_slices.h"
#include "meshtrain/parallel/fsdp.h"
#include "meshtrain/parallel/optimizer.h"

namespace meshtrain {

namespace {

class FsdpOptimizer : public Optimizer {
 public:
  FsdpOptimizer(ParallelModel& pm, Mesh& mesh, const LrConfig& cfg, at::ScalarType state_dtype)
      : pm_(pm), mesh_(mesh), cfg_(cfg) {
    MT_CHECK(pm.fsdp, "FSDP optimizer without FSDP units");
    const auto opts = pm.params.front().tensor.options().dtype(at::kFloat).requires_grad(false);
    step_t_ = at::zeros({}, opts);
    for (Fsdp::Unit& u : pm.fsdp->units())
      for (Fsdp::Flat& f : u.flats) {
        State s;
        s.flat = &f;
        s.exp_avg = at::zeros({f.slice}, opts.dtype(state_dtype));
        s.exp_avg_sq = at::zeros({f.slice}, opts.dtype(state_dtype));
        s.slices = slice_runs(pm, mesh, f.params, f.offsets, f.begin, f.slice);
        states_.push_back(std::move(s));
      }
  }

  at::Tensor reduce_gradients() override {
    at::NoGradGuard no_grad;
    pm_.fsdp->reduce_root();
    at::Tensor sq = at::zeros({1}, step_t_.options().dtype(at::kDouble));
    for (const State& s : states_) sq = sq + (s.flat->grad.to(at::kDouble).pow(2) * s.slices.norm_mask).sum().reshape({1});
    // Each dp rank holds a different part of every summed gradient (the
    // experts' slices partition each ep rank's experts over expert_dp, and the
    // ep ranks hold different experts): summing over dp counts each once.
    if (mesh_.shape().dp > 1) mesh_.dp().all_reduce(sq);
    if (mesh_.shape().tp > 1) mesh_.tp().all_reduce(sq);
    if (mesh_.shape().pp > 1) mesh_.pp().all_reduce(sq);
    return sq.sqrt().squeeze(0);
  }

  void step(const LearningRate& lr, const at::Tensor& found_inf, const at::Tensor& grad_scale) override {
    at::NoGradGuard no_grad;
    const bool sharded = pm_.fsdp->stage() == 3;
    // Stage 2's whole parameters are the truth: their owned slices are updated.
    std::vector<at::Tensor> owned;
    for (const State& s : states_) owned.push_back(sharded ? s.flat->shard : owned_slice(pm_, *s.flat));
    std::vector<at::Tensor> grads, m, v;
    std::vector<const SliceRuns*> runs;
    for (const State& s : states_) {
      grads.push_back(s.flat->grad);
      m.push_back(s.exp_avg);
      v.push_back(s.exp_avg_sq);
      runs.push_back(&s.slices);
    }
    adamw_on_slices(owned, grads, m, v, runs, step_t_, lr, cfg_, found_inf, grad_scale);
    if (sharded) {
      pm_.fsdp->release_all();
    } else {
      for (size_t k = 0; k < states_.size(); ++k) {
        const Fsdp::Flat& f = *states_[k].flat;
        const at::Tensor all = f.comm->size() > 1 ? f.comm->all_gather(owned[k], 0) : owned[k];
        std::vector<at::Tensor> updated(pm_.params.size());
        unflatten(pm_, f.params, f.offsets, all, updated);
        for (size_t i : f.params) pm_.params[i].tensor.detach().copy_(updated[i]);
      }
    }
    pm_.fsdp->zero_grad();
  }

  int64_t steps_taken() const override { return static_cast<int64_t>(step_t_.item<float>()); }
  void set_steps_taken(int64_t s) override {
    at::NoGradGuard no_grad;
    step_t_.fill_(static_cast<double>(s));
  }
  int64_t state_numel() const override {
    int64_t n = 0;
    for (const State& s : states_) n += s.exp_avg.numel() + s.exp_avg_sq.numel();
    return n;
  }

  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> moments_to_save(HostCopies& host) override {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> m(pm_.params.size()), v(pm_.params.size());
    std::vector<bool> in_unit(pm_.params.size(), false);
    for (State& s : states_) {
      const Fsdp::Flat& f = *s.flat;
      std::vector<bool> written;
      for (size_t i : f.params) {
        in_unit[i] = true;
        written.push_back(group_writes_checkpoint(pm_.params[i].layout, mesh_));
      }
      gather_to_writer(pm_, f.params, f.offsets, written, s.exp_avg, *f.comm, /*in_param_dtype=*/false, host, m);
      gather_to_writer(pm_, f.params, f.offsets, written, s.exp_avg_sq, *f.comm, /*in_param_dtype=*/false, host, v);
    }
    // Parameters outside every unit (non-trainable) have no moments: zeros,
    // made on the host, so they load on any zero_stage.
    for (size_t i = 0; i < pm_.params.size(); ++i)
      if (!in_unit[i] && writes_checkpoint(pm_.params[i].layout, mesh_)) {
        m[i] = host.add(at::zeros(pm_.params[i].tensor.sizes(), at::kFloat));
        v[i] = host.add(at::zeros(pm_.params[i].tensor.sizes(), at::kFloat));
      }
    return {m, v};
  }

  void load_moments(const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq) override {
    at::NoGradGuard no_grad;
    MT_CHECK(exp_avg.size() == pm_.params.size() && exp_avg_sq.size() == pm_.params.size(), "zero_stage ",
             pm_.fsdp->stage(), ": moments for ", exp_avg.size(), " parameters, this rank has ", pm_.params.size());
    for (State& s : states_) {
      const Fsdp::Flat& f = *s.flat;
      s.exp_avg.copy_(slice_of(pm_, f.params, f.offsets, f.begin, f.slice, exp_avg, s.exp_avg.options()));
      s.exp_avg_sq.copy_(slice_of(pm_, f.params, f.offsets, f.begin, f.slice, exp_avg_sq, s.exp_avg.options()));
    }
  }

  ResidentBytes resident_bytes() const override {
    ResidentBytes b = parameter_bytes(pm_);
    for (const State& s : states_) {
      if (s.flat->shard.defined()) b.params += static_cast<int64_t>(s.flat->shard.nbytes());
      b.grads += static_cast<int64_t>(s.flat->grad.nbytes());
      b.optimizer += static_cast<int64_t>(s.exp_avg.nbytes() + s.exp_avg_sq.nbytes());
    }
    return b;
  }

 private:
  // AdamW's state for one flat space of a unit.
  struct State {
    Fsdp::Flat* flat = nullptr;
    at::Tensor exp_avg, exp_avg_sq;                        // [slice]
    SliceRuns slices;                                      // runs by weight decay, norm mask
  };

  ParallelModel& pm_;
  Mesh& mesh_;
  LrConfig cfg_;
  at::Tensor step_t_;  // 0-dim fp32 step counter on the device
  std::vector<State> states_;
};

}  // namespace

std::unique_ptr<Optimizer> make_fsdp_optimizer(ParallelModel& pm, Mesh& mesh, const Config& cfg) {
  MT_CHECK(pm.fsdp, "zero_stage ", cfg.zero_stage, ": the model has no FSDP units (parallelize() installs them)");
  return std::make_unique<FsdpOptimizer>(pm, mesh, cfg.lr, state_dtype(cfg));
}

}  // namespace meshtrain
