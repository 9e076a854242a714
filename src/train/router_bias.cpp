// update_score_bias (train/step.h): DeepSeek-V3's auxiliary-loss-free load
// balancing. Each MoE layer's score bias (selection only, no gradient) moves
// by router_bias_update_rate toward balance: up for experts that got fewer
// than the mean share of the step's assignments, down for busier ones. The
// loads are the step's global counts (reduced over the whole mesh), so every
// replica of a layer makes the same update.
#include <torch/torch.h>

#include <cmath>

#include "meshtrain/core/check.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/train/step.h"

namespace meshtrain {

void update_score_bias(Session& session, const StepStats& s) {
  const ModelConfig& m = session.config().model;
  if (!m.router_bias || m.router_bias_update_rate <= 0) return;
  // A step skipped for a non-finite loss or norm changes nothing, the bias included.
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) return;
  at::NoGradGuard no_grad;
  // Where each of this stage's MoE layers is in expert_fraction (all MoE
  // layers, global order), in this stage's order: the order of its score
  // biases, which MoE tags where it creates them (ParamLayout::router_score_bias).
  std::vector<size_t> moe_index;
  for (int64_t i : session.model().model->range().layers()) {
    if (!is_moe_layer(m, i)) continue;
    size_t before = 0;
    for (int64_t l = 0; l < i; ++l) before += is_moe_layer(m, l) ? 1 : 0;
    moe_index.push_back(before);
  }
  const double mean = 1.0 / static_cast<double>(m.n_experts);
  size_t k = 0;
  for (auto& p : session.model().params) {
    if (!p.layout.router_score_bias) continue;
    MT_ASSERT(k < moe_index.size(), "more MoE score biases than MoE layers on this stage");
    const size_t j = moe_index[k++];
    if (j >= s.expert_fraction.size()) continue;
    const at::Tensor load = at::tensor(s.expert_fraction[j], at::kDouble).to(at::kFloat);
    p.tensor.add_((mean - load).sign().to(p.tensor.device(), p.tensor.scalar_type()) * m.router_bias_update_rate);
  }
  MT_ASSERT(k == moe_index.size(), "this stage has ", moe_index.size(), " MoE layers but ", k, " score biases");
}

}  // namespace meshtrain
