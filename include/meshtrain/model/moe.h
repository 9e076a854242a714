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
#include "meshtrain/model/token_dispatcher.h"
#include "meshtrain/model/token_layout.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

// Routing decision for a set of sequences, exposed for tests. Rows are tokens in
// [B, T] order (row = b * T + t); column j of expert/gate/keep is the token's
// (j+1)-th choice, best score first.
struct Routing {
  at::Tensor expert;   // [N, k] int64 chosen experts per token (N = B*T)
  at::Tensor gate;     // [N, k] combine weights (normalised over the k chosen)
  at::Tensor keep;     // [N, k] bool: assignment within capacity (all true in eval)
  at::Tensor probs;    // [N, E] router probabilities (for the aux loss)
  at::Tensor logits;   // [N, E] router logits (for the z-loss)
  // With a capacity (training, capacity_factor > 0): C assignments per expert
  // and sequence, and each assignment's 1-based slot among its expert's in
  // its sequence (kept iff slot <= C). capacity 0: unbounded, slot undefined.
  int64_t capacity = 0;
  at::Tensor slot;     // [N, k] int64
};

// Route tokens with router logits [B, T, E]. Scores are computed in fp32.
// Selection (DeepSeek-V3): the top-k of scores + `bias` ([E], undefined: none;
// it steers the choice only, gates use the plain scores), among the experts of
// the cfg.topk_group groups (of cfg.n_group) whose two best biased scores sum
// highest; the other experts' biased scores are set to 0, as in V3. Gates are
// the chosen scores normalised over the k, times cfg.routed_scaling_factor.
// Capacity C = ceil(capacity_factor * T * k / E) per expert and sequence
// (capacity_factor <= 0: unbounded). Assignments claim capacity in position-major
// order within a sequence: token 0's 1st, 2nd, .. choice, then token 1's, ...
// so an expert's overflow drops the latest tokens of the sequence. Nothing is
// dropped when training is false (eval, generation).
Routing route(const at::Tensor& router_logits, const ModelConfig& cfg, bool training,
              const at::Tensor& bias = at::Tensor());
// Aux loss E * sum_i f_i * P_i per sequence, averaged over the B sequences.
at::Tensor load_balancing_loss(const Routing& r, int64_t B, int64_t T, int64_t n_experts, int64_t k);

// Whether global layer i has the MoE feed-forward: ffn "moe", i >= first_k_dense
// and either moe_layers "all" or ("last_in_block") i is the last layer of its block.
bool is_moe_layer(const ModelConfig& cfg, int64_t layer);

class MoE : public torch::nn::Module {
 public:
  // prefix: global parameter name prefix, e.g. "layers.3.moe".
  MoE(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix);
  // x [B, T, d] (or the sequence shard under sequence parallelism). Returns the
  // FFN output in the layout of x; dropped assignments contribute nothing. With
  // aux: adds the load-balancing loss, the (unweighted) z-loss when
  // router_z_loss > 0, expert loads and dropped/assigned counts.
  // Under context parallelism (layout->gather) the router's logits of the
  // whole sequences are gathered (E numbers per token), so capacity and the
  // aux losses are those of whole sequences, as on one rank; each rank then
  // runs its own tokens' assignments.
  at::Tensor forward(const at::Tensor& x, ForwardAux* aux, const TokenLayout* layout = nullptr);

  const std::shared_ptr<Linear>& router() const { return router_; }
  const at::Tensor& w_in() const { return w_in_; }
  const at::Tensor& w_out() const { return w_out_; }
  const at::Tensor& w_gate() const { return w_gate_; }          // undefined unless swiglu
  const at::Tensor& score_bias() const { return score_bias_; }  // undefined unless router_bias

 private:
  // Routed experts on the flat input [N, d] -> [N, d] (this tp rank's partial
  // sum) by capacity slots: static shapes, no host sync (training with a
  // capacity and no expert biases; forward() runs the others by counts).
  at::Tensor experts_by_capacity(const at::Tensor& xflat, const Routing& r, const at::Tensor& gate, int64_t B,
                                 int64_t T);
  at::Tensor experts_dropless(const at::Tensor& xflat, const Routing& r, const at::Tensor& gate);
  // This rank's experts on rows grouped by local expert (counts[e] rows each;
  // row_expert: each row's local expert, for the input biases; row_sender:
  // the ep rank each row came from, FP8's scale groups).
  at::Tensor grouped_experts(const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& row_expert,
                             const at::Tensor& row_sender);

  ModelConfig cfg_;
  LayerFactory* factory_;
  std::shared_ptr<Linear> router_;
  // Routed experts are GELU MLPs like the dense one: w_in [E_local, h_local, d],
  // w_out [E, d, h_local] (hidden units split over tp), registered on the
  // child module "experts" so their names mirror the global ones. With
  // linear_bias also b_in [E, h_local] and b_out [E, d] (replicated: added
  // once, outside the tp region, weighted by the gates like the outputs).
  std::shared_ptr<torch::nn::Module> experts_;
  at::Tensor w_in_, w_out_, b_in_, b_out_;
  // Where the routed experts live (model/token_dispatcher.h): w_in, w_out and
  // b_in hold this rank's n_experts / dispatcher_->size() of them.
  std::shared_ptr<TokenDispatcher> dispatcher_;
  // mlp_activation swiglu: w_gate [E, h_local, d], split like w_in.
  at::Tensor w_gate_;
  // "score_bias" [E] with router_bias: a parameter so checkpoints carry it,
  // but without gradient (selection is not differentiable); it moves only by
  // router_bias_update_rate (train/router_bias.cpp).
  at::Tensor score_bias_;
  // shared_expert "mlp": the n_shared experts fused into one MLP of n_shared *
  // hidden units (child module "shared" with "w_in"/"w_out"); null when
  // n_shared == 0.
  std::shared_ptr<torch::nn::Module> shared_;
  std::shared_ptr<Linear> shared_in_, shared_out_, shared_gate_;  // + "w_gate" with swiglu
  // shared_expert "linear" / "linear_discarded" (Jaxformer): one replicated
  // linear "shared_proj" d -> n_shared * d whose n_shared chunks are summed.
  std::shared_ptr<Linear> shared_proj_;
};

}  // namespace meshtrain
