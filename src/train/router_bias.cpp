// update_score_bias (train/step.h): DeepSeek-V3's auxiliary-loss-free load
// balancing. Each MoE layer's score bias (selection only, no gradient) moves
// by router_bias_update_rate toward balance: up for experts that got fewer
// than the mean share of the step's assignments, down for busier ones. The
// loads are the step's global counts (reduced over the whole mesh), so every
// replica of a layer makes the same update.
#include <torch/torch.h>

#include <cmath>

#include "meshtrain/model/moe.h"
#include "meshtrain/train/step.h"

namespace meshtrain {

void update_score_bias(Session& session, const StepStats& s) {
  const ModelConfig& m = session.config().model;
  if (!m.router_bias || m.router_bias_update_rate <= 0) return;
  // A step skipped for a non-finite loss or norm changes nothing, the bias included.
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) return;
  at::NoGradGuard no_grad;
  // expert_fraction lists the MoE layers in global order.
  std::vector<int64_t> moe_layers;
  for (int64_t i = 0; i < m.n_layers(); ++i)
    if (is_moe_layer(m, i)) moe_layers.push_back(i);
  for (size_t j = 0; j < s.expert_fraction.size() && j < moe_layers.size(); ++j) {
    const std::string name = "layers." + std::to_string(moe_layers[j]) + ".moe.score_bias";
    for (auto& p : session.model().params) {
      if (p.layout.global_name != name) continue;
      const at::Tensor load = at::tensor(s.expert_fraction[j], at::kDouble).to(at::kFloat);
      const double mean = 1.0 / static_cast<double>(m.n_experts);
      p.tensor.add_((mean - load).sign().to(p.tensor.device(), p.tensor.scalar_type()) * m.router_bias_update_rate);
    }
  }
}

}  // namespace meshtrain
