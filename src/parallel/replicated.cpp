// The replicated strategy (zero_stage 0, parallel/data_parallel.h): whole
// gradients summed over dp -- in buckets during backward where
// overlap_grad_reduce runs them (parallel/grad_buckets.h), else here -- and
// AdamW over the whole parameters.
#include <torch/torch.h>

#include "gradient_sums.h"
#include "meshtrain/core/check.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/parallel/checkpoint_writer.h"
#include "meshtrain/parallel/grad_buckets.h"
#include "strategies.h"

namespace meshtrain {

namespace {

class Replicated : public DataParallel {
 public:
  Replicated(ParallelModel& pm, Mesh& mesh, const Config& cfg, bool buckets)
      : pm_(pm), mesh_(mesh), opt_(params(pm), cfg.lr, state_dtype(cfg)) {
    if (buckets)
      buckets_ = std::make_unique<GradBuckets>(pm, mesh, static_cast<int64_t>(cfg.grad_bucket_mb * (1 << 20)));
    // Whole parameters updated here: the update can write their casts too
    // (model/mixed_precision.h), so no step reads the fp32 weights to cast them.
    if (cfg.optimizer_writes_casts && pm.model && pm.model->precision().policy().mixed()) {
      precision_ = &pm.model->precision();
      std::vector<at::Tensor> ts;
      for (const auto& p : opt_.params()) ts.push_back(p.param);
      precision_->keep_casts(ts);
    }
  }

  void arm(int64_t chunk) override {
    if (buckets_) buckets_->arm(chunk);
  }

  void reduce() override {
    at::NoGradGuard no_grad;
    // The buckets launched during backward are waited for, the rest
    // launched now: before anything below reads a gradient.
    if (buckets_) buckets_->finish();
    sum_partial_gradients(pm_, mesh_, all_params(pm_));
    if (mesh_.shape().dp > 1) {
      // Under expert parallelism a routed expert's gradient already holds
      // the tokens of its whole ep group: the sum over the ranks holding the
      // same experts (expert_dp) completes it. Without it, expert_dp() is dp.
      std::vector<at::Tensor> grads, expert_grads;
      for (size_t i = 0; i < pm_.params.size(); ++i) {
        const ParamInfo& p = pm_.params[i];
        if ((buckets_ && buckets_->covers(i)) || !p.tensor.grad().defined()) continue;
        (p.layout.expert_split && mesh_.shape().ep > 1 ? expert_grads : grads).push_back(p.tensor.grad());
      }
      all_reduce_flat(grads, mesh_.dp());
      all_reduce_flat(expert_grads, mesh_.expert_dp());
    }
  }

  void update(const LearningRate& lr, const at::Tensor& found_inf, const at::Tensor& grad_scale) override {
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

  ResidentBytes resident_bytes() const override {
    ResidentBytes b = parameter_bytes(pm_);
    for (const auto& p : opt_.params())
      b.optimizer += static_cast<int64_t>(p.exp_avg.nbytes() + p.exp_avg_sq.nbytes());
    return b;
  }

  const GradBuckets* buckets() const override { return buckets_.get(); }
  AdamW* adamw() override { return &opt_; }

  // Each parameter once, whatever the mesh: tp replicas only from tp rank
  // 0, the tied copy never; dp ranks hold replicas, the ep ranks different
  // experts. One foreach norm per group, no host read.
  at::Tensor grad_norm() override {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> grads, expert_grads;
    for (auto& p : pm_.params) {
      if (!p.tensor.grad().defined() || p.layout.tied_copy) continue;
      if (p.layout.split_dim < 0 && mesh_.coord().tp != 0) continue;
      (p.layout.expert_split && mesh_.shape().ep > 1 ? expert_grads : grads).push_back(p.tensor.grad());
    }
    // On the parameters' device: with NCCL the reductions move device memory.
    const auto opts = pm_.params.front().tensor.options().dtype(at::kDouble);
    const auto sum_sq = [&](const std::vector<at::Tensor>& g) {
      return g.empty() ? at::zeros({1}, opts)
                       : at::stack(at::_foreach_norm(g, 2)).to(at::kDouble).pow(2).sum().reshape({1});
    };
    at::Tensor sq = sum_sq(grads);
    if (mesh_.shape().ep > 1) {
      at::Tensor e = sum_sq(expert_grads);
      mesh_.ep().all_reduce(e);
      sq = sq + e;
    }
    return global_norm(sq, mesh_, /*sharded_over_dp=*/false);
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
  // Declared after the optimizer, destroyed before it: it unhooks the parameters.
  std::unique_ptr<GradBuckets> buckets_;
  MixedPrecision* precision_ = nullptr;  // optimizer_writes_casts in a bf16 model, else null
};

}  // namespace

std::unique_ptr<DataParallel> make_replicated(ParallelModel& pm, Mesh& mesh, const Config& cfg, bool buckets) {
  return std::make_unique<Replicated>(pm, mesh, cfg, buckets);
}

}  // namespace meshtrain
