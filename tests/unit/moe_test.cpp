// MoE routing, capacity, aux loss and the grouped expert compute against
// hand-computed values and a naive per-token reference loop.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <vector>

#include "meshtrain/model/moe.h"

namespace meshtrain {
namespace {

ModelConfig moe_config(int64_t d, int64_t E, int64_t k, int64_t h, int64_t n_shared, double cf) {
  ModelConfig c;
  c.model_dimension = d;
  c.n_experts = E;
  c.k = k;
  c.mlp_hidden = h;
  c.n_shared = n_shared;
  c.capacity_factor = cf;
  c.ffn = FfnKind::Moe;
  return c;
}

at::Tensor logits_of(std::vector<float> v, int64_t B, int64_t T, int64_t E) {
  return torch::tensor(v).reshape({B, T, E});
}

std::vector<int64_t> to_vec(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous().reshape({-1});
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

at::Tensor param(torch::nn::Module& m, const std::string& name) {
  auto p = m.named_parameters().find(name);
  EXPECT_NE(p, nullptr) << name;
  return p ? *p : at::Tensor();
}

// Per token and per choice, no grouping: what the grouped compute must equal.
at::Tensor reference_forward(MoE& moe, const ModelConfig& c, const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2), N = B * T;
  auto logits = at::linear(x, param(moe, "router.weight"));
  Routing r = route(logits, c, moe.is_training());
  auto xf = x.reshape({N, d});
  auto w_in = param(moe, "experts.w_in"), w_out = param(moe, "experts.w_out");
  std::vector<at::Tensor> rows;
  for (int64_t n = 0; n < N; ++n) {
    at::Tensor y = at::zeros({d});
    for (int64_t j = 0; j < c.k; ++j) {
      if (!r.keep[n][j].item<bool>()) continue;
      const int64_t e = r.expert[n][j].item<int64_t>();
      auto hid = at::gelu(at::mv(w_in[e], xf[n]), "tanh");
      y = y + r.gate[n][j] * at::mv(w_out[e], hid);
    }
    if (c.n_shared > 0) {
      auto hid = at::gelu(at::mv(param(moe, "shared.w_in.weight"), xf[n]), "tanh");
      y = y + at::mv(param(moe, "shared.w_out.weight"), hid);
    }
    rows.push_back(y);
  }
  return at::stack(rows).reshape({B, T, d});
}

TEST(Route, Top1ChoosesArgmaxAndDropsOverflowInTrainingOnly) {
  // C = ceil(1.0 * T * k / E) = ceil(4 / 2) = 2: tokens 0, 1, 2 want expert 0,
  // so token 2 (the latest) overflows; token 3 goes to expert 1.
  auto c = moe_config(4, 2, 1, 8, 0, 1.0);
  auto logits = logits_of({2, 0, 1, -1, 3, 2, 0, 1}, 1, 4, 2);
  Routing r = route(logits, c, /*training=*/true);
  EXPECT_EQ(to_vec(r.expert), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(to_vec(r.keep), (std::vector<int64_t>{1, 1, 0, 1}));
  EXPECT_TRUE(torch::allclose(r.gate, torch::ones({4, 1})));
  EXPECT_TRUE(torch::allclose(r.probs, torch::softmax(logits.reshape({4, 2}), -1)));

  Routing ev = route(logits, c, /*training=*/false);
  EXPECT_EQ(to_vec(ev.expert), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(to_vec(ev.keep), (std::vector<int64_t>{1, 1, 1, 1}));
}

TEST(Route, Top2GatesAreNormalisedSoftmaxOverTheChosen) {
  auto c = moe_config(4, 4, 2, 8, 0, 2.0);
  auto logits = logits_of({2, 1, 0, -1, /**/ -3, 0.5f, 4, 0}, 1, 2, 4);
  Routing r = route(logits, c, true);
  EXPECT_EQ(to_vec(r.expert), (std::vector<int64_t>{0, 1, 2, 1}));
  // Softmax renormalised over the two chosen = softmax over their logits.
  const double g0 = 1.0 / (1.0 + std::exp(-1.0)), g1 = 1.0 / (1.0 + std::exp(-3.5));
  auto expect = torch::tensor({g0, 1 - g0, g1, 1 - g1}, at::kFloat).reshape({2, 2});
  EXPECT_TRUE(torch::allclose(r.gate, expect, 1e-5, 1e-6)) << r.gate;
  EXPECT_TRUE(torch::allclose(r.gate.sum(-1), torch::ones({2})));
}

TEST(Route, CapacityIsPositionMajorAndPerSequence) {
  // E=3, k=2, T=2, cf=0.75: C = ceil(0.75 * 2 * 2 / 3) = 1 per expert and sequence.
  // Sequence 0: token 0 -> (0, 1), token 1 -> (1, 2). Position-major, token 0's
  // 2nd choice (expert 1) is served before token 1's 1st choice (also expert 1),
  // which is dropped. Sequence 1 routes the same and gets its own capacity.
  auto c = moe_config(4, 3, 2, 8, 0, 0.75);
  auto logits = logits_of({3, 2, 0, /**/ 0, 3, 2, /**/ 3, 2, 0, /**/ 0, 3, 2}, 2, 2, 3);
  Routing r = route(logits, c, true);
  EXPECT_EQ(to_vec(r.expert), (std::vector<int64_t>{0, 1, 1, 2, 0, 1, 1, 2}));
  EXPECT_EQ(to_vec(r.keep), (std::vector<int64_t>{1, 1, 0, 1, 1, 1, 0, 1}));
  EXPECT_EQ(to_vec(route(logits, c, false).keep), (std::vector<int64_t>(8, 1)));
  // A non-positive capacity factor means no bound.
  c.capacity_factor = 0;
  EXPECT_EQ(to_vec(route(logits, c, true).keep), (std::vector<int64_t>(8, 1)));
}

TEST(Route, SigmoidScores) {
  auto c = moe_config(4, 3, 2, 8, 0, 2.0);
  c.router_score = RouterScore::Sigmoid;
  auto logits = logits_of({1, -2, 0.5f}, 1, 1, 3);
  Routing r = route(logits, c, true);
  EXPECT_EQ(to_vec(r.expert), (std::vector<int64_t>{0, 2}));
  const double s0 = 1 / (1 + std::exp(-1.0)), s2 = 1 / (1 + std::exp(-0.5));
  auto expect = torch::tensor({s0 / (s0 + s2), s2 / (s0 + s2)}, at::kFloat).reshape({1, 2});
  EXPECT_TRUE(torch::allclose(r.gate, expect, 1e-5, 1e-6)) << r.gate;
  EXPECT_TRUE(torch::allclose(r.probs, torch::sigmoid(logits.reshape({1, 3}))));
}

TEST(LoadBalancingLoss, MatchesHandComputation) {
  // B=2, T=2, E=2, k=1.
  auto c = moe_config(4, 2, 1, 8, 0, 2.0);
  auto logits = logits_of({1, 0, /**/ 2, 0, /**/ 0, 1, /**/ 0.5f, 0}, 2, 2, 2);
  Routing r = route(logits, c, true);
  auto sm = [](double a, double b) { return std::exp(a) / (std::exp(a) + std::exp(b)); };
  // Sequence 0: both tokens pick expert 0 -> f = (1, 0); P_0 = mean(sm(1,0), sm(2,0)).
  const double l0 = 2 * (1.0 * 0.5 * (sm(1, 0) + sm(2, 0)));
  // Sequence 1: one token each -> f = (1/2, 1/2); P sums to 1 -> loss = 2 * 1/2.
  const double l1 = 2 * (0.5 * 0.5 * (sm(0, 1) + sm(0.5, 0)) + 0.5 * 0.5 * (sm(1, 0) + sm(0, 0.5)));
  EXPECT_NEAR(load_balancing_loss(r, 2, 2, 2, 1).item<double>(), 0.5 * (l0 + l1), 1e-6);
}

TEST(LoadBalancingLoss, IsOneWhenRoutingIsUniform) {
  Routing r;
  r.expert = torch::tensor({0, 1, 2, 3, 1, 2, 3, 0}, at::kLong).reshape({4, 2});
  r.probs = torch::full({4, 4}, 0.25);
  EXPECT_NEAR(load_balancing_loss(r, 1, 4, 4, 2).item<double>(), 1.0, 1e-6);
  // Everything on one expert with a confident router: E * 1 * 1 = E.
  r.expert = torch::zeros({4, 2}, at::kLong);
  r.probs = torch::zeros({4, 4});
  r.probs.select(1, 0).fill_(1.0);
  EXPECT_NEAR(load_balancing_loss(r, 1, 4, 4, 2).item<double>(), 4.0, 1e-6);
}

TEST(MoE, ParametersAreNamedLikeTheirGlobalNames) {
  LayerFactory f;
  f.set_seed(7);
  auto c = moe_config(8, 4, 2, 16, 2, 1.0);
  MoE moe(c, f, "layers.1.moe");
  auto params = moe.named_parameters();
  ASSERT_EQ(params.size(), 5u);
  EXPECT_EQ(params["router.weight"].sizes(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(params["experts.w_in"].sizes(), (std::vector<int64_t>{4, 16, 8}));
  EXPECT_EQ(params["experts.w_out"].sizes(), (std::vector<int64_t>{4, 8, 16}));
  EXPECT_EQ(params["shared.w_in.weight"].sizes(), (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(params["shared.w_out.weight"].sizes(), (std::vector<int64_t>{8, 32}));
  // Drawn under prefix + path, so a tp factory slicing the same draw agrees.
  EXPECT_TRUE(torch::equal(params["experts.w_in"], init_normal(7, "layers.1.moe.experts.w_in", {4, 16, 8}, 0.02)));
  const double std_out = 0.02 / std::sqrt(2.0 * c.n_layers());
  EXPECT_TRUE(
      torch::equal(params["experts.w_out"], init_normal(7, "layers.1.moe.experts.w_out", {4, 8, 16}, std_out)));
  EXPECT_TRUE(torch::equal(params["router.weight"], init_normal(7, "layers.1.moe.router.weight", {4, 8}, 0.02)));
}

TEST(MoE, CombineIsTheGateWeightedSumOfExpertOutputs) {
  // d = h = 2, identity router (logits = x), expert e: w_in = (e + 1) * I,
  // w_out = I, so expert e maps x to gelu((e + 1) x).
  LayerFactory f;
  auto c = moe_config(2, 2, 2, 2, 0, 2.0);
  MoE moe(c, f, "moe");
  {
    torch::NoGradGuard ng;
    param(moe, "router.weight").copy_(torch::eye(2));
    param(moe, "experts.w_in").copy_(torch::stack({torch::eye(2), 2 * torch::eye(2)}));
    param(moe, "experts.w_out").copy_(torch::stack({torch::eye(2), torch::eye(2)}));
  }
  auto x = torch::tensor({1.0f, 0.0f, 0.0f, 2.0f}).reshape({1, 2, 2});
  auto y = moe.forward(x, nullptr);
  auto sm0 = [](double a, double b) { return std::exp(a) / (std::exp(a) + std::exp(b)); };
  std::vector<double> expect;
  for (auto [a, b] : std::vector<std::pair<double, double>>{{1, 0}, {0, 2}}) {
    const double g0 = sm0(a, b), g1 = 1 - g0;
    expect.push_back(g0 * gelu_tanh(a) + g1 * gelu_tanh(2 * a));
    expect.push_back(g0 * gelu_tanh(b) + g1 * gelu_tanh(2 * b));
  }
  EXPECT_TRUE(torch::allclose(y, torch::tensor(expect, at::kFloat).reshape({1, 2, 2}), 1e-5, 1e-6)) << y;
}

TEST(MoE, GroupedComputeEqualsPerTokenReferenceWithDropsAndSharedExperts) {
  torch::manual_seed(0);
  LayerFactory f;
  f.set_seed(3);
  auto c = moe_config(8, 4, 2, 12, 1, 0.5);  // C = ceil(0.5 * 6 * 2 / 4) = 2: drops
  c.init_std = 0.5;                          // large enough that routing is not a tie
  MoE moe(c, f, "moe");
  auto x = torch::randn({2, 6, 8}).requires_grad_();

  moe.train();
  auto y = moe.forward(x, nullptr);
  auto ref = reference_forward(moe, c, x);
  EXPECT_LT((y - ref).abs().max().item<double>(), 1e-5);
  Routing r = route(at::linear(x, param(moe, "router.weight")), c, true);
  EXPECT_GT((~r.keep).sum().item<int64_t>(), 0) << "the case must drop assignments";

  // Gradients of the grouped path equal those of the reference.
  auto wy = torch::randn_like(y);
  (y * wy).sum().backward();
  std::map<std::string, at::Tensor> grads;
  for (auto& p : moe.named_parameters()) grads[p.key()] = p.value().grad().clone();
  const at::Tensor dx = x.grad().clone();
  moe.zero_grad();
  x.mutable_grad().reset();
  (reference_forward(moe, c, x) * wy).sum().backward();
  // The input's gradient too: the dispatch's backward, the router's and the shared experts'.
  EXPECT_LT((dx - x.grad()).abs().max().item<double>(), 1e-5);
  for (auto& p : moe.named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_LT((grads[p.key()] - p.value().grad()).abs().max().item<double>(), 1e-5) << p.key();
  }
  // The router learns through the gates even without the aux loss.
  EXPECT_GT(grads["router.weight"].abs().sum().item<double>(), 0);

  moe.eval();
  torch::NoGradGuard no_grad;
  EXPECT_LT((moe.forward(x, nullptr) - reference_forward(moe, c, x)).abs().max().item<double>(), 1e-5);
  EXPECT_GT((moe.forward(x, nullptr) - y).abs().max().item<double>(), 1e-4) << "eval must not drop";
}

TEST(MoE, AuxBookkeepingAndAuxGradients) {
  torch::manual_seed(1);
  LayerFactory f;
  auto c = moe_config(8, 4, 2, 8, 0, 0.5);
  c.router_z_loss = 1e-3;
  c.init_std = 0.5;
  MoE moe(c, f, "moe");
  auto x = torch::randn({2, 6, 8});
  ForwardAux aux;
  moe.forward(x, &aux);

  auto logits = at::linear(x, param(moe, "router.weight"));
  Routing r = route(logits, c, true);
  EXPECT_NEAR(aux.aux_loss.item<double>(), load_balancing_loss(r, 2, 6, 4, 2).item<double>(), 1e-6);
  const double z = at::logsumexp(logits, -1).pow(2).mean().item<double>();
  EXPECT_NEAR(aux.z_loss.item<double>(), z, 1e-5);
  ASSERT_EQ(aux.expert_tokens.size(), 1u);
  EXPECT_TRUE(torch::equal(aux.expert_tokens[0], at::bincount(r.expert.reshape({-1}), {}, 4).to(at::kFloat)));
  EXPECT_EQ(aux.assigned.item<double>(), 24.0);
  EXPECT_EQ(aux.dropped.item<double>(), static_cast<double>((~r.keep).sum().item<int64_t>()));
  EXPECT_GT(aux.dropped.item<double>(), 0);

  // The aux loss reaches the router through P alone.
  aux.aux_loss.backward();
  EXPECT_GT(param(moe, "router.weight").grad().abs().sum().item<double>(), 0);

  // Counts accumulate over layers.
  moe.forward(x, &aux);
  EXPECT_EQ(aux.assigned.item<double>(), 48.0);
  EXPECT_EQ(aux.expert_tokens.size(), 2u);
}

// The dispatcher seam: with a capacity MoE hands its slots to the factory's
// TokenDispatcher and gets the same rows back; dropless on one expert-parallel
// rank keeps its counts on the device and needs no exchange (the by-counts
// exchange of ep > 1 is tested by tests/dist/ep_test); capacity_factor 0
// drops nothing even when one expert is everyone's first choice.
struct CountingDispatcher : TokenDispatcher {
  int by_counts = 0, by_slots = 0, combined = 0;
  Dispatched dispatch(const at::Tensor& rows, const std::vector<int64_t>& counts) override {
    ++by_counts;
    return TokenDispatcher::dispatch(rows, counts);
  }
  at::Tensor combine(const at::Tensor& rows, const Dispatched& d) override {
    ++combined;
    return TokenDispatcher::combine(rows, d);
  }
  at::Tensor dispatch_slots(const at::Tensor& slots) override {
    ++by_slots;
    return slots;
  }
};

TEST(MoE, DroplessDropsNothingAndOnOneRankNeedsNoExchange) {
  torch::manual_seed(2);
  LayerFactory f;
  auto counting = std::make_shared<CountingDispatcher>();
  f.set_token_dispatcher(counting);
  auto c = moe_config(8, 4, 1, 8, 0, 0.0);
  c.init_std = 0.5;
  MoE moe(c, f, "moe");
  // Every token prefers expert 2: with any capacity most would be dropped.
  auto w = param(moe, "router.weight");
  {
    at::NoGradGuard g;
    w.zero_();
    w[2].fill_(1.0);
  }
  auto x = torch::rand({2, 6, 8}) + 0.5;
  moe.train();
  ForwardAux aux;
  auto y = moe.forward(x, &aux);
  EXPECT_EQ(aux.dropped.item<double>(), 0.0);
  EXPECT_EQ(aux.expert_tokens[0][2].item<float>(), 12.0f);
  EXPECT_LT((y - reference_forward(moe, c, x)).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(counting->by_counts, 0);
  EXPECT_EQ(counting->combined, 0);
  EXPECT_EQ(counting->by_slots, 0);
  // With a capacity the static slot path goes through the dispatcher instead.
  auto capped = moe_config(8, 4, 1, 8, 0, 1.0);
  MoE moe2(capped, f, "moe2");
  moe2.train();
  moe2.forward(x, nullptr);
  EXPECT_EQ(counting->by_slots, 1);
  EXPECT_EQ(counting->by_counts, 0);
}

TEST(MoE, RejectsBadShapes) {
  LayerFactory f;
  auto c = moe_config(8, 4, 2, 8, 0, 1.0);
  MoE moe(c, f, "moe");
  EXPECT_ANY_THROW(moe.forward(torch::randn({2, 3, 7}), nullptr));
  c.k = 5;
  EXPECT_ANY_THROW(MoE(c, f, "moe2"));
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// DeepSeek-V3's router by hand: sigmoid scores, groups scored by their two
// best (biased) experts, the bias steering the choice but not the gates,
// gates normalised over the k then scaled.
TEST(MoeRouting, DeepSeekV3GroupLimitedBiasedSelection) {
  ModelConfig c = moe_config(4, 4, 2, 8, 0, 0);
  c.router_score = RouterScore::Sigmoid;
  c.n_group = 2;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.0;
  const at::Tensor logits = logits_of({2.0f, -1.0f, 1.0f, 1.5f}, 1, 1, 4);
  const at::Tensor s = at::sigmoid(logits.reshape({4}));
  const auto sv = [&](int64_t e) { return s[e].item<double>(); };
  // Group {2, 3} (0.731 + 0.818) beats group {0, 1} (0.881 + 0.269).
  Routing r = route(logits, c, false);
  EXPECT_EQ(to_vec(r.expert), (std::vector<int64_t>{3, 2}));
  EXPECT_NEAR(r.gate[0][0].item<double>(), 2.0 * sv(3) / (sv(2) + sv(3)), 1e-6);
  // A bias of -1 on expert 2 turns the choice to group {0, 1}; gates use the plain scores.
  r = route(logits, c, false, torch::tensor({0.0f, 0.0f, -1.0f, 0.0f}));
  EXPECT_EQ(to_vec(r.expert), (std::vector<int64_t>{0, 1}));
  EXPECT_NEAR(r.gate[0][0].item<double>(), 2.0 * sv(0) / (sv(0) + sv(1)), 1e-6);
  EXPECT_NEAR(r.gate[0][1].item<double>(), 2.0 * sv(1) / (sv(0) + sv(1)), 1e-6);
}

// first_k_dense (DeepSeek-V3's first_k_dense_replace): the first k layers
// are dense, before moe_layers picks among the rest.
TEST(MoeLayers, FirstKDenseLayersAreDense) {
  ModelConfig c = moe_config(8, 4, 2, 8, 0, 0);
  c.blocks = 2;
  c.layers_per_block = 2;
  c.first_k_dense = 1;
  EXPECT_EQ((std::vector<bool>{is_moe_layer(c, 0), is_moe_layer(c, 1), is_moe_layer(c, 2), is_moe_layer(c, 3)}),
            (std::vector<bool>{false, true, true, true}));
  c.moe_layers = MoeLayers::LastInBlock;
  c.first_k_dense = 2;
  EXPECT_EQ((std::vector<bool>{is_moe_layer(c, 0), is_moe_layer(c, 1), is_moe_layer(c, 2), is_moe_layer(c, 3)}),
            (std::vector<bool>{false, false, false, true}));
}

}  // namespace
}  // namespace meshtrain
