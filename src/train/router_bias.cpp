// update_score_bias (train/step.h): DeepSeek-V3's auxiliary-loss-free load
// balancing. Each MoE layer's score bias (selection only, no gradient) moves
// by router_bias_update_rate toward balance: up for experts that got fewer
// than the mean share of the step's assignments, down for busier ones. The
// loads are the step's global counts (reduced over the whole mesh), so every
// replica of a layer makes the same update.
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/train/step.h"

namespace meshtrain {

void update_score_bias(Session& session, const StepStats& s) {
  const ModelConfig& m = session.config().model;
  if (!m.router_bias || m.router_bias_update_rate <= 0) return;
  at::NoGradGuard no_grad;
  // On the device, from the step's sums, so the step needs no host read: a
  // step skipped for a non-finite loss or norm changes nothing (the update is
  // multiplied by 0 there), the bias included.
  at::Tensor finite = at::isfinite(s.sums.ce);
  if (s.grad_norm_t.defined()) finite = finite.logical_and(at::isfinite(s.grad_norm_t.reshape({1})));
  const at::Tensor keep = finite.to(at::kFloat);
  const double mean = 1.0 / static_cast<double>(m.n_experts);
  // This stage's score biases are in its MoE layers' order (MoE tags them
  // where it creates them, ParamLayout::router_score_bias); expert_tokens
  // has one row per layer of the model, the layer's global counts, then one
  // per multi-token prediction module (mtp.<j>.*: layer n_layers + j).
  std::vector<int64_t> moe_layers;
  for (int64_t i : session.model().model->range().layers())
    if (is_moe_layer(m, i)) moe_layers.push_back(i);
  size_t k = 0;
  for (auto& p : session.model().params) {
    if (!p.layout.router_score_bias) continue;
    int64_t layer = 0;
    if (p.path.rfind("mtp.", 0) == 0) {
      layer = m.n_layers() + std::stoll(p.path.substr(4));  // "mtp.<j>.block.moe.score_bias"
    } else {
      MT_ASSERT(k < moe_layers.size(), "more MoE score biases than MoE layers on this stage");
      layer = moe_layers[k++];
    }
    MT_ASSERT(layer < s.sums.expert_tokens.size(0), p.path, " is the score bias of layer ", layer,
              " but the step counted experts for ", s.sums.expert_tokens.size(0), " layers");
    const at::Tensor counts = s.sums.expert_tokens[layer];  // fp64: the load in double, then float, as read() does
    const at::Tensor total = counts.sum();
    const at::Tensor load = (counts / total.clamp_min(1)).to(at::kFloat);
    const at::Tensor moved = keep * (total > 0).to(at::kFloat);  // no assignments: nothing to balance
    p.tensor.add_(((mean - load).sign() * moved).to(p.tensor.device(), p.tensor.scalar_type()) *
                  m.router_bias_update_rate);
  }
  MT_ASSERT(k == moe_layers.size(), "this stage has ", moe_layers.size(), " MoE layers but ", k, " score biases");
}

}  // namespace meshtrain
