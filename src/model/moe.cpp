// MoE: route -> dispatch -> compute experts -> combine (see moe.h).
#include "meshtrain/model/moe.h"

#include <torch/torch.h>

#include <cmath>
#include <optional>

#include "meshtrain/core/check.h"
#include "meshtrain/model/activation.h"
#include "meshtrain/model/fp8_linear.h"
#include "meshtrain/model/gelu_matmul.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/ops/slot_rows.h"

namespace meshtrain {

namespace {

// The router's logits: x widened to fp32 for an fp32 GEMM with the fp32
// master weight. Backward: the weight's (and bias's) gradient from fp32
// products; x's straight out of a GEMM in x's dtype (the logits' gradient
// and the weight rounded to it, as every other layer's input gradient is
// computed), not an fp32 [N, d] product cast down by a kernel of its own.
class RouterLogitsFn : public torch::autograd::Function<RouterLogitsFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
    const at::Tensor xf = x.to(at::kFloat);
    ctx->save_for_backward({xf, w});
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias"] = b.has_value();
    return at::linear(xf, w, b ? *b : at::Tensor());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &xf = s[0], &w = s[1];
    const auto dt = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor g = grads[0].reshape({-1, w.size(0)});
    const at::Tensor dx = at::mm(g.to(dt), w.to(dt)).view(xf.sizes());
    const at::Tensor dw = at::mm(g.t(), xf.reshape({-1, w.size(1)}));
    return {dx, dw, ctx->saved_data["bias"].toBool() ? g.sum(0) : at::Tensor()};
  }
};

// at::one_hot checks its indices' range with host reads on every device but
// CUDA; a scatter gives the same [.., E] int64 tensor with none.
at::Tensor expert_one_hot(const at::Tensor& idx, int64_t E) {
  std::vector<int64_t> shape = idx.sizes().vec();
  shape.push_back(E);
  return at::zeros(shape, idx.options().dtype(at::kLong)).scatter_(-1, idx.unsqueeze(-1), 1);
}

// Experts left to choose from under group-limited routing: the biased scores
// with every expert outside the topk_group best groups set to 0 (DeepSeek-V3
// masks with 0, not -inf, and exported models must choose alike).
at::Tensor group_limited(const at::Tensor& choice, int64_t n_group, int64_t topk_group) {
  const int64_t N = choice.size(0), E = choice.size(1);
  const auto grouped = choice.view({N, n_group, E / n_group});
  const auto group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1);  // [N, n_group]
  const auto best = std::get<1>(group_scores.topk(topk_group, -1));
  const auto keep = at::zeros_like(group_scores).scatter(1, best, 1.0).to(at::kBool);
  return choice.masked_fill(~keep.unsqueeze(-1).expand({N, n_group, E / n_group}).reshape({N, E}), 0.0);
}

}  // namespace

Routing route(const at::Tensor& router_logits, const ModelConfig& cfg, bool training, const at::Tensor& bias) {
  MT_CHECK(router_logits.dim() == 3, "MoE router logits must be [B, T, E], got ", router_logits.sizes());
  const int64_t B = router_logits.size(0), T = router_logits.size(1), E = router_logits.size(2);
  const int64_t k = cfg.k;
  MT_CHECK(E == cfg.n_experts, "MoE router logits have ", E, " experts but model_config.n_experts is ",
           cfg.n_experts);
  MT_CHECK(k >= 1 && k <= E, "model_config.k must be in [1, n_experts=", E, "], got ", k);
  const int64_t N = B * T;

  Routing r;
  // fp32 even under bf16 mixed precision: top-k on rounded scores flips choices
  // between otherwise identical runs, and the aux loss needs accurate P.
  r.logits = router_logits.to(at::kFloat).reshape({N, E});
  r.probs = cfg.router_score == RouterScore::Softmax ? at::softmax(r.logits, -1) : at::sigmoid(r.logits);
  at::Tensor choice = r.probs.detach();
  if (bias.defined()) choice = choice + bias.detach().to(at::kFloat);
  if (cfg.n_group > 1) choice = group_limited(choice, cfg.n_group, cfg.topk_group);
  const at::Tensor idx = std::get<1>(at::topk(choice, k, /*dim=*/-1, /*largest=*/true, /*sorted=*/true));
  r.expert = idx;
  const at::Tensor top = r.probs.gather(1, idx);
  // Sigmoid scores can underflow to 0 for very negative logits; the clamp only
  // guards that corner (softmax's top-1 is always >= 1/E).
  r.gate = top / top.sum(-1, /*keepdim=*/true).clamp_min(1e-20);
  if (cfg.routed_scaling_factor != 1.0) r.gate = r.gate * cfg.routed_scaling_factor;

  if (!training || cfg.capacity_factor <= 0) {
    r.keep = at::ones({N, k}, idx.options().dtype(at::kBool));
    return r;
  }
  const auto capacity = static_cast<int64_t>(std::ceil(cfg.capacity_factor * static_cast<double>(T * k) /
                                                       static_cast<double>(E)));
  // Flattening [T, k] per sequence gives the position-major priority order;
  // a running count per expert along it is each assignment's 1-based slot.
  auto onehot = expert_one_hot(idx.reshape({B, T * k}), E);  // [B, T*k, E]
  auto slot = (onehot.cumsum(1) * onehot).sum(-1);        // [B, T*k]
  r.keep = (slot <= capacity).reshape({N, k});
  r.capacity = capacity;
  r.slot = slot.reshape({N, k});
  return r;
}

at::Tensor load_balancing_loss(const Routing& r, int64_t B, int64_t T, int64_t n_experts, int64_t k) {
  MT_CHECK(r.expert.size(0) == B * T && r.expert.size(1) == k, "routing has shape ", r.expert.sizes(),
           ", expected [", B * T, ", ", k, "]");
  // f counts assignments before capacity: a saturated expert must still be
  // pushed away from, not look balanced because its overflow was dropped.
  auto f = expert_one_hot(r.expert.reshape({B, T * k}), n_experts).to(at::kFloat).sum(1) /
           static_cast<double>(T * k);                                // [B, E], no grad
  auto P = r.probs.reshape({B, T, n_experts}).mean(1);                // [B, E]
  return (static_cast<double>(n_experts) * (f * P).sum(-1)).mean();  // mean over sequences
}

bool is_moe_layer(const ModelConfig& cfg, int64_t layer) {
  if (cfg.ffn != FfnKind::Moe) return false;
  if (layer < cfg.first_k_dense) return false;  // DeepSeek-V3's first_k_dense_replace
  if (cfg.moe_layers == MoeLayers::All) return true;
  return layer % cfg.layers_per_block == cfg.layers_per_block - 1;
}

MoE::MoE(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix)
    : cfg_(cfg), factory_(&factory) {
  MT_CHECK(cfg.n_experts >= 1, "ffn=moe needs model_config.n_experts >= 1, got ", cfg.n_experts);
  MT_CHECK(cfg.k >= 1 && cfg.k <= cfg.n_experts, "model_config.k must be in [1, n_experts=", cfg.n_experts,
           "], got ", cfg.k);
  MT_CHECK(cfg.n_shared >= 0, "model_config.n_shared must be >= 0, got ", cfg.n_shared);
  const int64_t d = cfg.model_dimension, E = cfg.n_experts, h = cfg.hidden_dim();
  const double std = cfg.init_std;
  // Out projections scaled by depth (GPT-2) so the residual stream's variance
  // does not grow with the number of layers.
  const double std_out = cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers()));

  const bool b = cfg.linear_bias;
  router_ = register_module("router", factory.replicated(prefix + ".router", d, E, std, b, SequenceInput::Gathered));
  experts_ = register_module("experts", std::make_shared<torch::nn::Module>());
  // Routed experts: this rank's share of them under expert parallelism.
  dispatcher_ = factory.token_dispatcher();
  w_in_ = experts_->register_parameter("w_in", factory.expert_param(prefix + ".experts.w_in", {E, h, d}, 1, std));
  w_out_ = experts_->register_parameter("w_out",
                                        factory.expert_param(prefix + ".experts.w_out", {E, d, h}, 2, std_out));
  if (cfg.gated_mlp())
    w_gate_ =
        experts_->register_parameter("w_gate", factory.expert_param(prefix + ".experts.w_gate", {E, h, d}, 1, std));
  // The router reads its weight in fp32; the routed experts' matrices only
  // through their bf16 casts (b_in and b_out are read in fp32).
  factory.set_compute_cast(prefix + ".router.weight", false);
  for (const char* w : {".experts.w_in", ".experts.w_out", ".experts.w_gate"})
    if (factory.layouts().count(prefix + w)) factory.set_compute_cast(prefix + w, true);
  // FP8 (model/fp8_linear.h): the experts' GEMMs, not the router's.
  factory.precision()->unmark_fp8(router_->weight());
  factory.mark_fp8(w_in_, LayerFactory::Fp8Shard::Out, false);
  factory.mark_fp8(w_out_, LayerFactory::Fp8Shard::In, false);
  if (w_gate_.defined()) factory.mark_fp8(w_gate_, LayerFactory::Fp8Shard::Out, false);
  if (cfg.router_bias) {
    const std::string name = prefix + ".score_bias";
    ParamLayout layout{{E}, -1, name};
    layout.router_score_bias = true;
    factory.record_layout(name, std::move(layout));
    score_bias_ = register_parameter("score_bias", at::zeros({E}), /*requires_grad=*/false);
  }
  if (b) {
    b_in_ = experts_->register_parameter("b_in", factory.expert_param(prefix + ".experts.b_in", {E, h}, 1, 0.0));
    // b_out is added on the token's own rank after combine (outside the tp
    // region), so it stays whole there: not split over expert parallelism.
    b_out_ = experts_->register_parameter("b_out", factory.param(prefix + ".experts.b_out", {E, d}, -1, 0.0));
  }
  if (cfg.n_shared > 0 && cfg.shared_expert == SharedExpert::Mlp) {
    shared_ = register_module("shared", std::make_shared<torch::nn::Module>());
    shared_in_ =
        shared_->register_module("w_in", factory.column(prefix + ".shared.w_in", d, cfg.n_shared * h, std, b));
    if (cfg.gated_mlp())
      shared_gate_ =
          shared_->register_module("w_gate", factory.column(prefix + ".shared.w_gate", d, cfg.n_shared * h, std, b));
    shared_out_ =
        shared_->register_module("w_out", factory.row(prefix + ".shared.w_out", cfg.n_shared * h, d, std_out, b));
  } else if (cfg.n_shared > 0) {
    shared_proj_ =
        register_module("shared_proj", factory.replicated(prefix + ".shared_proj", d, cfg.n_shared * d, std, b,
                                                                 SequenceInput::Gathered));
  }
}

at::Tensor MoE::experts_by_capacity(const at::Tensor& xflat, const Routing& r, const at::Tensor& gate, int64_t B,
                                    int64_t T) {
  // Every expert gets B * C slots (C per sequence) in one buffer; assignment
  // (b, t, j) goes to row expert * B * C + b * C + slot - 1. Static shapes:
  // no host sync, and the experts run as two batched GEMMs over [E, B * C]
  // rows.
  const int64_t E = cfg_.n_experts, k = cfg_.k, d = cfg_.model_dimension, N = xflat.size(0);
  const int64_t C = r.capacity, S = B * C;
  const auto ids = r.expert.options();
  const at::Tensor a = at::arange(N * k, ids);
  const at::Tensor seq = a.div(T * k, "floor");
  const at::Tensor slot_row = r.expert.reshape({N * k}) * S + seq * C + (r.slot.reshape({N * k}) - 1);
  // Kept assignments' rows, -1 for dropped ones. The buffer is one gather of
  // the tokens' rows (zero rows for empty slots), and the combine one
  // weighted sum per token (ops/slot_rows.h): neither a zeroed buffer
  // scattered into nor a copy of x with a zero row appended.
  const ops::SlotMap map =
      ops::slot_map(at::where(r.keep.reshape({N * k}), slot_row, at::full({}, -1, ids)).view({N, k}), E * S);
  // Dispatch: this rank's experts get every sender's slots ([E_local, ep * S, d]).
  const at::Tensor xin = dispatcher_->dispatch_slots(ops::slots_from_tokens(xflat, map).view({E, S, d}));
  MixedPrecision& mp = *factory_->precision();
  // The expert weights' gradients come out of their GEMMs in fp32 (model/mixed_matmul.h).
  // Empty slots get the bias too; nothing reads their outputs.
  at::Tensor expert_out;  // [E_local, ep*S, d]
  if (cfg_.mlp_activation == MlpActivation::Gelu && !w_gate_.defined() && !mp.fp8()) {
    // The GELU inside the GEMMs (model/gelu_matmul.h).
    expert_out = gelu_linear(linear_gelu(xin, w_in_, b_in_, mp), w_out_, {}, {}, mp);
  } else {
    // Under FP8 each sender's S slots of an expert are an operand of their own.
    const int64_t senders = dispatcher_->size();
    const at::Tensor gate_in = w_gate_.defined() ? batched_linear(xin, w_gate_, mp, senders) : at::Tensor();
    at::Tensor pre = batched_linear(xin, w_in_, mp, senders);  // [E_local, ep*S, h]
    if (b_in_.defined()) pre = pre + b_in_.unsqueeze(1).to(pre.scalar_type());
    expert_out = batched_linear(apply_activation(cfg_.mlp_activation, pre, gate_in), w_out_, mp, senders);
  }
  const at::Tensor out = dispatcher_->combine_slots(expert_out);  // [E, S, d]
  // Combine: gates scale each tp rank's partial output before exit_tp sums
  // them (exact: the combine is linear); dropped assignments add nothing.
  return ops::tokens_from_slots(out.reshape({E * S, d}), gate.view({N, k}), map);
}

at::Tensor MoE::experts_dropless(const at::Tensor& xflat, const Routing& r, const at::Tensor& gate) {
  // Every assignment is kept: sorted by expert (stable, so token order within
  // an expert), each expert's rows are one group of a grouped GEMM.
  const int64_t E = cfg_.n_experts, k = cfg_.k, N = xflat.size(0);
  const at::Tensor expert = r.expert.reshape({N * k});
  const auto [sorted_expert, assignment] = expert.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  // Row i of the buffer holds assignment[i]: the map's slots are its inverse.
  const auto ids = assignment.options();
  const ops::SlotMap map =
      ops::slot_map(at::empty_like(assignment).index_copy_(0, assignment, at::arange(N * k, ids)).view({N, k}), N * k);
  const at::Tensor rows = ops::slots_from_tokens(xflat, map);
  // Through the dispatcher: local, or exchanged with the expert-parallel peers.
  at::Tensor out = dispatcher_->run_experts(
      rows, sorted_expert, E,
      [this](const at::Tensor& in, const at::Tensor& counts, const at::Tensor& row_expert,
             const at::Tensor& row_sender) {
        // No rows here: the (empty) rows stand in for the outputs, so an
        // exchange's backward still runs on this rank as on its peers.
        return in.size(0) == 0 ? in : grouped_experts(in, counts, row_expert, row_sender);
      });
  // Combine: gates scale each tp rank's partial output before exit_tp sums
  // them, which is exact because the combine is linear.
  return ops::tokens_from_slots(out, gate.view({N, k}), map);
}

at::Tensor MoE::grouped_experts(const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& row_expert,
                                const at::Tensor& row_sender) {
  // One grouped GEMM per projection (at::_grouped_mm: group g is rows
  // offs[g-1]..offs[g] times expert g's matrix), not a loop of small GEMMs.
  const at::Tensor offs = counts.cumsum(0).to(at::kInt);
  MixedPrecision& mp = *factory_->precision();
  const at::Tensor x = mp.operand(rows);
  // FP8: each (expert, sender) block of rows is an operand of its own.
  const int64_t senders = dispatcher_->size();
  const at::Tensor block = row_expert * senders + row_sender;
  auto gmm = [&](const at::Tensor& a, const at::Tensor& w) {
    if (const Fp8Split* split = mp.fp8_split(w))
      return fp8_grouped_linear(a, w, counts, block, w.size(0) * senders, mp, *split);
    return at::_grouped_mm(a, mp.operand(w).transpose(1, 2), offs);
  };
  at::Tensor pre = gmm(x, w_in_);
  if (b_in_.defined()) pre = pre + b_in_.index_select(0, row_expert).to(pre.scalar_type());
  const at::Tensor hid = apply_activation(cfg_.mlp_activation, pre, w_gate_.defined() ? gmm(x, w_gate_) : at::Tensor());
  return gmm(hid, w_out_);
}

namespace {

// The routing of this rank's tokens (rows b * T + q_index[t] of a whole-
// sequence routing), for context parallelism: capacity slots stay those of
// the whole sequence.
Routing own_rows(const Routing& all, const at::Tensor& q_index, int64_t B, int64_t T) {
  const at::Tensor rows =
      (at::arange(B, q_index.options()).unsqueeze(1) * T + q_index.unsqueeze(0)).reshape({-1});
  Routing r;
  r.expert = all.expert.index_select(0, rows);
  r.gate = all.gate.index_select(0, rows);
  r.keep = all.keep.index_select(0, rows);
  r.capacity = all.capacity;
  if (all.slot.defined()) r.slot = all.slot.index_select(0, rows);
  return r;
}

}  // namespace

at::Tensor MoE::forward(const at::Tensor& x, ForwardAux* aux, const TokenLayout* layout) {
  MT_CHECK(x.dim() == 3 && x.size(2) == cfg_.model_dimension, "MoE input must be [B, T, ",
           cfg_.model_dimension, "], got ", x.sizes());
  const int64_t E = cfg_.n_experts, k = cfg_.k, d = cfg_.model_dimension;

  // Route: the router is replicated and sees whole sequences (gathered under
  // sequence parallelism), so capacity and the aux loss are per full sequence
  // and every tp rank makes the same decisions.
  const at::Tensor xr = factory_->gather_sequence(x);
  const int64_t B = xr.size(0), T = xr.size(1), N = B * T;
  // The router matmul runs in fp32 even under bf16 mixed precision (the
  // fp32 master weight, no cast): bf16-rounded scores flip near-ties in
  // top-k, so meshes whose reductions round differently would send tokens to
  // different experts. The router is a replicated plain linear layer.
  const at::Tensor rb = router_->bias();
  const at::Tensor logits =
      RouterLogitsFn::apply(xr, router_->weight(), rb.defined() ? std::optional<at::Tensor>(rb) : std::nullopt);
  // Context parallelism: route whole sequences (the gather's backward sums
  // each rank's gradient of the logits back to the rank that owns them).
  const bool cp = layout != nullptr && static_cast<bool>(layout->gather);
  const Routing whole = route(cp ? layout->gather(logits, 1) : logits, cfg_, is_training(), score_bias_);
  const Routing r = cp ? own_rows(whole, layout->q_index, B, layout->T) : whole;

  // Expert region, hidden units split over tp. Assumption: enter_tp yields the
  // same full [B, T, d] tensor as gather_sequence (both all-gather the sequence
  // along dim 1 in rank order under sequence parallelism; both are x otherwise),
  // so routing rows index xe's rows directly.
  const at::Tensor xe = factory_->enter_tp(x);
  MT_ASSERT(xe.sizes() == xr.sizes(), "enter_tp and gather_sequence disagree on the MoE input layout");
  const at::Tensor xflat = xe.reshape({N, d});
  // Each tp rank's expert output is a partial sum over its hidden units, so
  // d loss / d gate is partial too. Passing the gates through the region entry
  // sums that gradient over tp (so the replicated router stays in sync); under
  // sequence parallelism the entry gathers dim 1, hence own chunk first.
  const at::Tensor gate =
      factory_->enter_tp(factory_->scatter_sequence(r.gate.reshape({B, T, k}))).reshape({N * k});

  // With a capacity: static shapes, no host sync. Dropless: grouped GEMMs
  // over the assignments sorted by expert.
  const at::Tensor routed =
      r.capacity > 0 ? experts_by_capacity(xflat, r, gate, B, T) : experts_dropless(xflat, r, gate);
  at::Tensor y = factory_->exit_tp(routed.reshape({B, T, d}));

  // Output biases: replicated, so added once after the tp sum, from the
  // replicated routing (whole sequences), then cut to this rank's shard.
  // Token n's assignments are rows n*k .. n*k+k-1; dropped ones weigh 0.
  if (b_out_.defined()) {
    const at::Tensor g = r.gate * r.keep.to(r.gate.scalar_type());                                  // [N, k]
    const at::Tensor bias = b_out_.index_select(0, r.expert.reshape({N * k})).view({N, k, d}) * g.unsqueeze(2);
    y = y + factory_->scatter_sequence(bias.sum(1).reshape({B, T, d})).to(y.scalar_type());
  }

  // Shared experts go through the factory's own column/row layers, which
  // carry their tp collectives like the dense MLP's do, so they are added
  // outside the hand-written region.
  // The routed experts' sum is the shared output GEMM's residual: added in
  // the GEMM, not by a kernel of its own.
  if (shared_in_)
    y = mlp_forward(cfg_.mlp_activation, *shared_in_, shared_gate_.get(), *shared_out_, x, y, *factory_->precision());
  // Jaxformer's shared "expert": a linear map summed over its n_shared
  // chunks, replicated like the router (whole sequences in, own shard out).
  // "linear_discarded" keeps the parameters but not the term, as
  // Jaxformer's MoE.__call__ does (it returns expert_outputs, not x).
  if (shared_proj_ && cfg_.shared_expert == SharedExpert::Linear) {
    const at::Tensor s = shared_proj_->forward(xr).view({B, T, cfg_.n_shared, d}).sum(2);
    y = y + factory_->scatter_sequence(s).to(y.scalar_type());
  }

  if (aux != nullptr) {
    // Every cp rank computes the whole sequences' losses: each adds 1/cp of
    // them, so the sums over ranks and the gradients (gathered back by the
    // logits' reduce-scatter) are one rank's.
    const double share = cp ? 1.0 / static_cast<double>(layout->cp) : 1.0;
    const int64_t Tw = cp ? layout->T : T;
    aux->add_aux(load_balancing_loss(whole, B, Tw, E, k) * share);
    if (cfg_.router_z_loss > 0) {
      // Unweighted, like aux_loss: the trainer applies router_z_loss (and alpha).
      aux->add_z(at::logsumexp(whole.logits, -1).pow(2).mean() * share);
    }
    // A scatter, not bincount: bincount sizes its output from the data, a host sync on GPUs.
    const at::Tensor ids = r.expert.reshape({N * k});
    const at::Tensor ones = at::ones({N * k}, r.gate.options().dtype(at::kFloat));
    aux->expert_tokens.push_back(at::zeros({E}, ones.options()).scatter_add_(0, ids, ones).detach());
    const at::Tensor dropped = (~r.keep).sum().to(at::kFloat).detach();
    const at::Tensor assigned = at::full({}, static_cast<double>(N * k), dropped.options());
    aux->dropped = aux->dropped.defined() ? aux->dropped + dropped : dropped;
    aux->assigned = aux->assigned.defined() ? aux->assigned + assigned : assigned;
  }
  return y;
}

}  // namespace meshtrain
