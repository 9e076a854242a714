#include "meshtrain/optim/adamw.h"

#include <torch/torch.h>

#include <algorithm>

#include "meshtrain/core/check.h"
#include "meshtrain/ops/adamw.h"

namespace meshtrain {

void fused_adamw(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                 const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq,
                 const at::Tensor& step, const LearningRate& lr, const LrConfig& cfg, double weight_decay,
                 const at::Tensor& found_inf, const at::Tensor& grad_scale) {
  if (params.empty()) return;
  MT_ASSERT(grads.size() == params.size() && exp_avg.size() == params.size() && exp_avg_sq.size() == params.size(),
            "fused_adamw: lists of different lengths");
  // bf16 moments: aten's fused update wants one dtype for every list.
  if (exp_avg.front().scalar_type() != at::kFloat) {
    ops::adamw_(params, grads, exp_avg, exp_avg_sq, step, {lr.value, cfg.beta1, cfg.beta2, weight_decay, cfg.eps},
                grad_scale, found_inf, {}, lr.tensor);
    return;
  }
  // Every parameter reads the one step counter: the lists may repeat a tensor.
  const std::vector<at::Tensor> steps(params.size(), step);
  std::optional<at::Tensor> inf;
  if (found_inf.defined()) inf = found_inf;
  std::optional<at::Tensor> scale;
  if (grad_scale.defined()) scale = grad_scale;
  if (lr.tensor.defined())
    at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr.tensor, cfg.beta1,
                      cfg.beta2, weight_decay, cfg.eps, /*amsgrad=*/false, /*maximize=*/false, scale, inf);
  else
    at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr.value, cfg.beta1,
                      cfg.beta2, weight_decay, cfg.eps, /*amsgrad=*/false, /*maximize=*/false, scale, inf);
}

at::ScalarType state_dtype(const Config& cfg) {
  return cfg.optimizer_state_dtype == ModelDtype::Bfloat16 ? at::kBFloat16 : at::kFloat;
}

AdamW::AdamW(std::vector<OptimParam> params, const LrConfig& cfg, at::ScalarType state_dtype)
    : params_(std::move(params)), cfg_(cfg) {
  MT_CHECK(!params_.empty(), "the optimizer got no parameters");
  for (auto& p : params_) {
    MT_CHECK(p.param.defined(), "optimizer parameter '", p.name, "' is undefined");
    auto opts = p.param.options().dtype(state_dtype);
    if (!p.exp_avg.defined()) p.exp_avg = at::zeros(p.param.sizes(), opts);
    if (!p.exp_avg_sq.defined()) p.exp_avg_sq = at::zeros(p.param.sizes(), opts);
  }
  step_ = at::zeros({}, params_.front().param.options().dtype(at::kFloat).requires_grad(false));
}

AdamW::AdamW(std::vector<OptimParam> slots, const LrConfig& cfg, const at::Device& device)
    : params_(std::move(slots)), cfg_(cfg) {
  for (const auto& p : params_)
    MT_ASSERT(p.exp_avg.defined() && p.exp_avg_sq.defined(), "AdamW slot '", p.name, "' without its moments");
  step_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
}

int64_t AdamW::steps_taken() const { return static_cast<int64_t>(step_.item<float>()); }

void AdamW::set_steps_taken(int64_t s) {
  at::NoGradGuard no_grad;
  step_.fill_(static_cast<double>(s));
}

void AdamW::step(const LearningRate& lr, const at::Tensor& found_inf, const at::Tensor& grad_scale,
                 const std::vector<at::Tensor>& casts) {
  std::vector<at::Tensor> values, grads;
  for (const OptimParam& o : params_) {
    values.push_back(o.param);
    grads.push_back(o.param.grad());
  }
  step(values, grads, lr, found_inf, grad_scale, casts);
}

void AdamW::step(const std::vector<at::Tensor>& values, const std::vector<at::Tensor>& grads, const LearningRate& lr,
                 const at::Tensor& found_inf, const at::Tensor& grad_scale, const std::vector<at::Tensor>& casts) {
  at::NoGradGuard no_grad;
  MT_ASSERT(values.size() == params_.size() && grads.size() == params_.size(), "AdamW::step: ", values.size(),
            " tensors and ", grads.size(), " gradients for ", params_.size(), " slots");
  MT_ASSERT(casts.empty() || casts.size() == params_.size(), "AdamW::step: ", casts.size(), " casts for ",
            params_.size(), " parameters");
  // [decay][has a cast]: one call per group (a call's casts are all or
  // nothing); with any cast, every group takes meshtrain::adamw_ (aten's
  // update writes no cast).
  const bool ours = std::any_of(casts.begin(), casts.end(), [](const at::Tensor& c) { return c.defined(); });
  std::vector<at::Tensor> p[2][2], g[2][2], m[2][2], v[2][2], c[2][2];
  for (size_t k = 0; k < params_.size(); ++k) {
    const OptimParam& o = params_[k];
    const at::Tensor& grad = grads[k];
    if (!grad.defined()) continue;
    const int i = o.decay ? 1 : 0, j = ours && casts[k].defined() ? 1 : 0;
    p[i][j].push_back(values[k]);
    g[i][j].push_back(grad);
    m[i][j].push_back(o.exp_avg);
    v[i][j].push_back(o.exp_avg_sq);
    if (j == 1) c[i][j].push_back(casts[k].view({-1}));
  }
  step_.add_(1);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      const double decay = i == 1 ? cfg_.weight_decay : 0.0;
      if (!ours) {
        fused_adamw(p[i][j], g[i][j], m[i][j], v[i][j], step_, lr, cfg_, decay, found_inf, grad_scale);
      } else if (!p[i][j].empty()) {
        ops::adamw_(p[i][j], g[i][j], m[i][j], v[i][j], step_, {lr.value, cfg_.beta1, cfg_.beta2, decay, cfg_.eps},
                    grad_scale, found_inf, c[i][j], lr.tensor);
      }
    }
  if (found_inf.defined()) step_.sub_(found_inf);  // a skipped update is no step
}

}  // namespace meshtrain
