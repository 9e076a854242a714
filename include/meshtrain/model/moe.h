#pragma once
// Mixture-of-Experts feed-forward: route -> dispatch -> compute experts ->
// combine (Megatron-Core's shape). Router scores (softmax or sigmoid) pick the
// top-k of n_experts routed experts with normalised gates; n_shared experts
// see every token. Capacity is per sequence (ceil(capacity_factor * T * k / E)
// assignments per expert and sequence), so it does not depend on how the batch
// is split over dp ranks or microbatches; overflow assignments are dropped (the
// token keeps its residual) in training only. The aux loss E * sum_i f_i * P_i
// is computed per sequence and averaged, for the same reason.
#include <torch/nn/module.h>

#include <string>

#include "meshtrain/config/config.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

// Routing decision for a set of sequences, exposed for tests.
struct Routing {
  at::Tensor expert;   // [N, k] int64 chosen experts per token (N = B*T)
  at::Tensor gate;     // [N, k] combine weights (normalised over the k chosen)
  at::Tensor keep;     // [N, k] bool: assignment within capacity
  at::Tensor probs;    // [N, E] router probabilities (for the aux loss)
  at::Tensor logits;   // [N, E] router logits (for the z-loss)
};

// Route tokens x [B, T, d] with router logits [B, T, E].
Routing route(const at::Tensor& router_logits, const ModelConfig& cfg, bool training);
// Aux loss E * sum_i f_i * P_i per sequence, averaged over the B sequences.
at::Tensor load_balancing_loss(const Routing& r, int64_t B, int64_t T, int64_t n_experts, int64_t k);

class MoE : public torch::nn::Module {
 public:
  // prefix: global parameter name prefix, e.g. "layers.3.moe".
  MoE(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix);
  // x [B, T, d] (or the sequence shard under sequence parallelism).
  at::Tensor forward(const at::Tensor& x, ForwardAux* aux);

 private:
  ModelConfig cfg_;
  LayerFactory* factory_;
  std::shared_ptr<Linear> router_;
  // Routed experts are GELU MLPs like the dense one: w_in [E, h_local, d],
  // w_out [E, d, h_local] (hidden units split over tp).
  at::Tensor w_in_, w_out_;
  // The n_shared experts fused into one MLP of n_shared * hidden units.
  std::shared_ptr<Linear> shared_in_, shared_out_;
};

}  // namespace meshtrain
