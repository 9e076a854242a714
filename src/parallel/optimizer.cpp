// The replicated AdamW behind the Optimizer interface, and the factory.
#include "meshtrain/parallel/optimizer.h"

#include <torch/torch.h>

#include <set>

#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/checkpoint_writer.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/zero.h"

namespace meshtrain {

namespace {

class ReplicatedAdamW : public Optimizer {
 public:
  ReplicatedAdamW(ParallelModel& pm, Mesh& mesh, const Config& cfg)
      : pm_(pm), mesh_(mesh), opt_(params(pm), cfg.lr, state_dtype(cfg)) {
    // Whole parameters updated here: the update can write their casts too
    // (model/mixed_precision.h), so no step reads the fp32 weights to cast them.
    if (cfg.optimizer_writes_casts && pm.model && pm.model->precision().policy().mixed()) {
      precision_ = &pm.model->precision();
      std::vector<at::Tensor> ts;
      for (const auto& p : opt_.params()) ts.push_back(p.param);
      precision_->keep_casts(ts);
    }
  }

  at::Tensor reduce_gradients() override { return grad_norm(pm_, mesh_); }

  void step(const LearningRate& lr, const at::Tensor& found_inf, const at::Tensor& grad_scale) override {
    if (!precision_) return opt_.step(lr, found_inf, grad_scale);
    std::vector<at::Tensor> casts, written;
    for (const auto& p : opt_.params()) {
      casts.push_back(p.param.grad().defined() ? precision_->cast_to_write(p.param) : at::Tensor());
      if (casts.back().defined()) written.push_back(p.param);
    }
    opt_.step(lr, found_inf, grad_scale, casts);
    precision_->casts_written(written);
  }
  int64_t steps_taken() const override { return opt_.steps_taken(); }
  void set_steps_taken(int64_t s) override { opt_.set_steps_taken(s); }
  int64_t state_numel() const override {
    int64_t n = 0;
    for (const auto& p : opt_.params()) n += p.exp_avg.numel() + p.exp_avg_sq.numel();
    return n;
  }
  int64_t state_bytes() const {
    int64_t n = 0;
    for (const auto& p : opt_.params()) n += static_cast<int64_t>(p.exp_avg.nbytes() + p.exp_avg_sq.nbytes());
    return n;
  }

  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> moments_to_save(HostCopies& host) override {
    const auto& ps = opt_.params();
    std::vector<at::Tensor> m(ps.size()), v(ps.size());
    for (size_t i = 0; i < ps.size(); ++i)
      if (writes_checkpoint(pm_.params[i].layout, mesh_)) {
        m[i] = host.add(ps[i].exp_avg);
        v[i] = host.add(ps[i].exp_avg_sq);
      }
    return {m, v};
  }

  void load_moments(const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq) override {
    at::NoGradGuard no_grad;
    auto& ps = opt_.params();
    MT_CHECK(exp_avg.size() == ps.size() && exp_avg_sq.size() == ps.size(), "optimizer: moments for ",
             exp_avg.size(), " parameters, this rank has ", ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      if (exp_avg[i].defined()) ps[i].exp_avg.copy_(exp_avg[i].reshape(ps[i].exp_avg.sizes()));
      else ps[i].exp_avg.zero_();
      if (exp_avg_sq[i].defined()) ps[i].exp_avg_sq.copy_(exp_avg_sq[i].reshape(ps[i].exp_avg_sq.sizes()));
      else ps[i].exp_avg_sq.zero_();
    }
  }

  AdamW* adamw() override { return &opt_; }
  ResidentBytes resident_bytes() const override {
    ResidentBytes b = parameter_bytes(pm_);
    b.optimizer = state_bytes();
    return b;
  }

 private:
  static std::vector<OptimParam> params(ParallelModel& pm) {
    std::vector<OptimParam> out;
    for (auto& p : pm.params) out.push_back({p.layout.global_name, p.tensor, p.decay, {}, {}});
    return out;
  }

  ParallelModel& pm_;
  Mesh& mesh_;
  AdamW opt_;
  MixedPrecision* precision_ = nullptr;  // optimizer_writes_casts in a bf16 model, else null
};

}  // namespace

ResidentBytes parameter_bytes(const ParallelModel& pm) {
  ResidentBytes b;
  std::set<const void*> seen;
  for (const ParamInfo& p : pm.params) {
    if (seen.insert(p.tensor.storage().unsafeGetStorageImpl()).second)
      b.params += static_cast<int64_t>(p.tensor.storage().nbytes());
    if (p.tensor.grad().defined()) b.grads += static_cast<int64_t>(p.tensor.grad().nbytes());
  }
  return b;
}

std::unique_ptr<Optimizer> make_optimizer(ParallelModel& pm, Mesh& mesh, const Config& cfg) {
  const int64_t stage = cfg.zero_stage_on(mesh.shape().dp);
  // The start-up line "precision: ..." says fp32 optimizer state: not so here.
  if (state_dtype(cfg) != at::kFloat) {
    spdlog::info("optimizer: AdamW moments kept in bf16 (optimizer_state_dtype), updated in fp32");
    // Rounding to nearest drops a change under half a bf16 step (2^-9 to 2^-8
    // of the value): one step's decay of exp_avg_sq, 1 - beta2, must exceed it.
    if (1.0 - cfg.lr.beta2 < 1.0 / 256)
      spdlog::warn("optimizer_state_dtype bfloat16 with lr.beta2 {}: exp_avg_sq's decay per step ({}) is below bf16's "
                   "rounding, so it may never decay; use beta2 <= 0.996 or float32 moments",
                   cfg.lr.beta2, 1.0 - cfg.lr.beta2);
  }
  if (stage >= 2) return make_fsdp_optimizer(pm, mesh, cfg);
  if (stage == 1) return std::make_unique<ZeroOptimizer>(pm, mesh, cfg.lr, state_dtype(cfg));
  return std::make_unique<ReplicatedAdamW>(pm, mesh, cfg);
}

}  // namespace meshtrain
