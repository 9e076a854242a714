#include "meshtrain/optim/adamw.h"

#include <torch/torch.h>

#include <cmath>

#include "meshtrain/core/check.h"

namespace meshtrain {

AdamW::AdamW(std::vector<OptimParam> params, const LrConfig& cfg)
    : params_(std::move(params)), beta1_(cfg.beta1), beta2_(cfg.beta2), eps_(cfg.eps),
      weight_decay_(cfg.weight_decay) {
  for (auto& p : params_) {
    MT_CHECK(p.param.defined(), "optimizer parameter '", p.name, "' is undefined");
    auto opts = p.param.options().dtype(at::kFloat);
    if (!p.exp_avg.defined()) p.exp_avg = at::zeros(p.param.sizes(), opts);
    if (!p.exp_avg_sq.defined()) p.exp_avg_sq = at::zeros(p.param.sizes(), opts);
  }
}

void AdamW::step(double lr) {
  ++step_;
  at::NoGradGuard no_grad;
  const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(step_));
  for (auto& p : params_) {
    at::Tensor g = p.param.grad();
    if (!g.defined()) continue;
    g = g.to(at::kFloat);
    p.exp_avg.mul_(beta1_).add_(g, 1.0 - beta1_);
    p.exp_avg_sq.mul_(beta2_).addcmul_(g, g, 1.0 - beta2_);
    at::Tensor denom = (p.exp_avg_sq / bc2).sqrt_().add_(eps_);
    at::Tensor update = (p.exp_avg / bc1).div_(denom);
    if (p.decay && weight_decay_ != 0.0) update.add_(p.param.to(at::kFloat), weight_decay_);
    p.param.sub_((update * lr).to(p.param.scalar_type()));
  }
}

}  // namespace meshtrain
