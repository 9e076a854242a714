// The FSDP strategy (zero_stage 2 and 3, parallel/data_parallel.h) over the
// units of parallel/fsdp.h. A step:
//   reduce()          the root unit's sums over tp / pp and its reduce-scatter
//                     (the layers' ran during backward), and the global norm
//                     from the owned slices
//   update(lr, .., c) AdamW on the owned slices, clipped by c inside the
//                     fused update (the same update as zero_stage 0 and 1);
//                     stage 2 all-gathers them back into the whole
//                     parameters, stage 3 keeps them and frees the root unit
//                     gathered during the step.
#include <torch/torch.h>

#include "gradient_sums.h"
#include "meshtrain/core/check.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/checkpoint_writer.h"
#include "meshtrain/parallel/flat_slices.h"
#include "meshtrain/parallel/fsdp.h"
#include "strategies.h"

namespace meshtrain {

namespace {

class FsdpDataParallel : public DataParallel {
 public:
  FsdpDataParallel(ParallelModel& pm, Mesh& mesh, const Config& cfg, int stage)
      : pm_(pm), mesh_(mesh), fsdp_(std::make_shared<Fsdp>(pm, mesh, stage, cfg.fsdp_keep_gathered)) {
    pm.model->set_layer_hooks(fsdp_);
    const auto opts = pm.params.front().tensor.options().dtype(state_dtype(cfg)).requires_grad(false);
    std::vector<const SliceRuns*> runs;
    std::vector<at::Tensor> m, v;
    for (Fsdp::Unit& u : fsdp_->units())
      for (Fsdp::Flat& f : u.flats) {
        State s;
        s.flat = &f;
        s.exp_avg = at::zeros({f.slice}, opts);
        s.exp_avg_sq = at::zeros({f.slice}, opts);
        s.slices = slice_runs(pm, mesh, f.params, f.offsets, f.begin, f.slice);
        states_.push_back(std::move(s));
      }
    for (const State& s : states_) {
      runs.push_back(&s.slices);
      m.push_back(s.exp_avg);
      v.push_back(s.exp_avg_sq);
    }
    opt_ = std::make_unique<AdamW>(slice_slots(runs, m, v), cfg.lr, pm.params.front().tensor.device());
    // The root unit's parameters are summed here after backward; the
    // layers' are FSDP's own, during it.
    for (const Fsdp::Flat& f : fsdp_->units().front().flats) root_.insert(root_.end(), f.params.begin(), f.params.end());
  }

  ~FsdpDataParallel() override { pm_.model->set_layer_hooks(nullptr); }

  void reduce() override {
    at::NoGradGuard no_grad;
    sum_partial_gradients(pm_, mesh_, root_);
    fsdp_->reduce_root();
  }

  at::Tensor grad_norm() override {
    at::NoGradGuard no_grad;
    at::Tensor sq = at::zeros({1}, pm_.params.front().tensor.options().dtype(at::kDouble));
    for (const State& s : states_) sq = sq + (s.flat->grad.to(at::kDouble).pow(2) * s.slices.norm_mask).sum().reshape({1});
    // Each dp rank holds a different part of every summed gradient (the
    // experts' slices partition each ep rank's experts over expert_dp, and the
    // ep ranks hold different experts): summing over dp counts each once.
    return global_norm(sq, mesh_, /*sharded_over_dp=*/true);
  }

  void update(const LearningRate& lr, const at::Tensor& found_inf, const at::Tensor& grad_scale) override {
    at::NoGradGuard no_grad;
    const bool sharded = fsdp_->stage() == 3;
    // Stage 2's whole parameters are the truth: their owned slices are updated.
    std::vector<at::Tensor> owned, grads;
    std::vector<const SliceRuns*> runs;
    for (const State& s : states_) {
      owned.push_back(sharded ? s.flat->shard : owned_slice(pm_, *s.flat));
      grads.push_back(s.flat->grad);
      runs.push_back(&s.slices);
    }
    opt_->step(slice_run_views(runs, owned), slice_run_views(runs, grads), lr, found_inf, grad_scale);
    if (sharded) {
      fsdp_->release_all();
    } else {
      for (size_t k = 0; k < states_.size(); ++k) {
        const Fsdp::Flat& f = *states_[k].flat;
        const at::Tensor all = f.comm->size() > 1 ? f.comm->all_gather(owned[k], 0) : owned[k];
        std::vector<at::Tensor> updated(pm_.params.size());
        unflatten(pm_, f.params, f.offsets, all, updated);
        for (size_t i : f.params) pm_.params[i].tensor.detach().copy_(updated[i]);
      }
    }
    fsdp_->zero_grad();
  }

  int64_t steps_taken() const override { return opt_->steps_taken(); }
  void set_steps_taken(int64_t s) override { opt_->set_steps_taken(s); }
  Fsdp* fsdp() override { return fsdp_.get(); }
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
             fsdp_->stage(), ": moments for ", exp_avg.size(), " parameters, this rank has ", pm_.params.size());
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
  std::shared_ptr<Fsdp> fsdp_;  // shared with the model's layer hooks
  std::vector<State> states_;
  std::unique_ptr<AdamW> opt_;  // over the states' runs (flat_slices.h slice_slots)
  std::vector<size_t> root_;    // the root unit's parameters (indices into pm.params)
};

}  // namespace

std::unique_ptr<DataParallel> make_fsdp(ParallelModel& pm, Mesh& mesh, const Config& cfg, int stage) {
  return std::make_unique<FsdpDataParallel>(pm, mesh, cfg, stage);
}

}  // namespace meshtrain
