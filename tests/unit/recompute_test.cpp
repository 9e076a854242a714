// Activation recomputation (activation_checkpointing, model/recompute.h):
// "full" and "selective" give the losses and gradients of "none" (dense and
// MoE + MLA, dropout included), the MoE aux loss keeps its gradient, and the
// activations live after a forward shrink.
//
// Memory is measured honestly: a MemoryReportingInfoBase on this thread sees
// every CPU allocation and free (the hook the profiler's memory view uses), so
// "bytes still allocated after the forward" is what autograd keeps for backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <map>
#include <string>

#include "meshtrain/model/recompute.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {
namespace {

ModelConfig dense(double dropout = 0.0) {
  ModelConfig c;
  c.model_dimension = 32;
  c.vocab_size = 61;
  c.n_head = 4;
  c.blocks = 2;
  c.layers_per_block = 2;
  c.T = 32;
  c.dropout_rate = dropout;
  c.init_std = 0.1;
  return c;
}

ModelConfig moe_mla() {
  ModelConfig c = dense();
  c.attention = AttentionKind::Mla;
  c.ffn = FfnKind::Moe;
  c.latent_dim = 16;
  c.dhR = 4;
  c.n_experts = 4;
  c.k = 2;
  c.n_shared = 1;
  c.mlp_hidden = 24;
  c.capacity_factor = 1.0;  // some drops: the recompute must route alike
  c.router_z_loss = 1e-3;
  return c;
}

struct Result {
  double loss = 0, aux = 0;
  std::map<std::string, at::Tensor> grads;
  int64_t live_bytes = 0;  // allocated by the forward and still held when it returns
};

// Counts live CPU bytes on this thread while installed.
class LiveBytes : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device) override { live += size; }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t live = 0;
};

// A single-process factory whose dropout forks like tp rank 1 of a
// sequence-parallel mesh does (every dropout draws from a per-call fork).
class ForkingDropoutFactory : public LayerFactory {
 public:
  std::shared_ptr<DropoutRng> dropout_rng() const override {
    return std::make_shared<TensorParallelDropoutRng>(1, /*sequence_parallel=*/true);
  }
};

Result run(const ModelConfig& cfg, ActivationCheckpointing mode, uint64_t rng_seed = 7,
           bool forked_dropout = false) {
  LayerFactory plain;
  ForkingDropoutFactory forking;
  LayerFactory& f = forked_dropout ? forking : plain;
  Transformer m(cfg, f);
  m.set_activation_checkpointing(mode);
  m.train();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto tokens = at::randint(cfg.vocab_size, {4, cfg.T}, gen, at::TensorOptions().dtype(at::kLong));
  const auto targets = at::roll(tokens, -1, 1);
  torch::manual_seed(rng_seed);  // dropout masks
  Result r;
  auto reporter = std::make_shared<LiveBytes>();
  at::Tensor loss;
  ForwardAux aux;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, reporter);
    loss = m.loss(tokens, targets, &aux);
    if (aux.aux_loss.defined()) loss = loss + 0.01 * aux.aux_loss + aux.z_loss;
    r.live_bytes = reporter->live;
  }
  r.loss = loss.item<double>();
  r.aux = aux.aux_loss.defined() ? aux.aux_loss.item<double>() : 0.0;
  loss.backward();
  for (const auto& p : m.named_parameters()) {
    EXPECT_TRUE(p.value().grad().defined()) << mode << ": no gradient for " << p.key();
    if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().clone();
  }
  return r;
}

void expect_same(const Result& ref, const Result& got, const std::string& what) {
  EXPECT_NEAR(ref.loss, got.loss, 1e-6) << what;
  EXPECT_NEAR(ref.aux, got.aux, 1e-6) << what;
  ASSERT_EQ(ref.grads.size(), got.grads.size()) << what;
  for (const auto& [name, g] : ref.grads) {
    const auto& h = got.grads.at(name);
    const double diff = (g - h).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6 * std::max(1.0, g.abs().max().item<double>())) << what << ": " << name;
  }
}

TEST(ActivationCheckpointing, DenseSameLossesAndGradients) {
  const auto none = run(dense(), ActivationCheckpointing::None);
  expect_same(none, run(dense(), ActivationCheckpointing::Full), "dense full");
  expect_same(none, run(dense(), ActivationCheckpointing::Selective), "dense selective");
}

TEST(ActivationCheckpointing, DropoutMasksAreReplayed) {
  const auto none = run(dense(0.2), ActivationCheckpointing::None);
  expect_same(none, run(dense(0.2), ActivationCheckpointing::Full), "dropout full");
  expect_same(none, run(dense(0.2), ActivationCheckpointing::Selective), "dropout selective");
  // The masks do matter: another seed gives another loss.
  EXPECT_GT(std::abs(none.loss - run(dense(0.2), ActivationCheckpointing::None, 8).loss), 1e-4);
}

// tp-sharded regions draw their dropout masks from per-call forks of the
// generator (dropout_rng.h); the recompute replays those forks too.
TEST(ActivationCheckpointing, ForkedDropoutMasksAreReplayed) {
  const auto none = run(dense(0.2), ActivationCheckpointing::None, 7, true);
  expect_same(none, run(dense(0.2), ActivationCheckpointing::Full, 7, true), "forked dropout full");
  expect_same(none, run(dense(0.2), ActivationCheckpointing::Selective, 7, true), "forked dropout selective");
  // The forks draw other masks than the default stream.
  EXPECT_GT(std::abs(none.loss - run(dense(0.2), ActivationCheckpointing::None, 7, false).loss), 1e-4);
}

TEST(ActivationCheckpointing, MoEAndMLASameLossesGradientsAndAux) {
  const auto none = run(moe_mla(), ActivationCheckpointing::None);
  EXPECT_GT(none.aux, 0.0);
  expect_same(none, run(moe_mla(), ActivationCheckpointing::Full), "moe full");
  expect_same(none, run(moe_mla(), ActivationCheckpointing::Selective), "moe selective");
}

TEST(ActivationCheckpointing, AuxLossAloneReachesTheRouter) {
  // Only the aux loss, through the checkpointed function's second output.
  for (ActivationCheckpointing mode :
       {ActivationCheckpointing::None, ActivationCheckpointing::Full, ActivationCheckpointing::Selective}) {
    LayerFactory f;
    Transformer m(moe_mla(), f);
    m.set_activation_checkpointing(mode);
    m.train();
    const auto tokens = at::randint(61, {2, 32}, at::TensorOptions().dtype(at::kLong));
    ForwardAux aux;
    at::Tensor h = m.forward_layers(m.embed(tokens), &aux);
    (aux.aux_loss + 0.0 * h.sum()).backward();
    double router = 0;
    for (const auto& p : m.named_parameters())
      if (p.key().find("router") != std::string::npos && p.value().grad().defined())
        router += p.value().grad().abs().sum().item<double>();
    EXPECT_GT(router, 0.0) << mode;
    EXPECT_EQ(aux.expert_tokens.size(), 4u) << mode << ": expert counts of every layer reach the caller";
  }
}

TEST(ActivationCheckpointing, KeepsFewerActivations) {
  const auto none = run(dense(), ActivationCheckpointing::None);
  const auto full = run(dense(), ActivationCheckpointing::Full);
  const auto sel = run(dense(), ActivationCheckpointing::Selective);
  std::printf("live bytes after forward: none %lld, selective %lld, full %lld\n",
              static_cast<long long>(none.live_bytes), static_cast<long long>(sel.live_bytes),
              static_cast<long long>(full.live_bytes));
  EXPECT_GT(none.live_bytes, 0);
  EXPECT_LT(sel.live_bytes, none.live_bytes);
  EXPECT_LT(full.live_bytes, sel.live_bytes);
  // Full keeps about one [B, T, d] input per layer plus the embedding/head
  // part: well under half of what "none" keeps.
  EXPECT_LT(full.live_bytes * 2, none.live_bytes);
}

TEST(ActivationCheckpointing, EvalAndDecodingAreUnchanged) {
  LayerFactory f;
  Transformer m(dense(), f);
  m.set_activation_checkpointing(ActivationCheckpointing::Full);
  m.eval();
  const auto tokens = at::randint(61, {2, 8}, at::TensorOptions().dtype(at::kLong));
  const auto targets = at::roll(tokens, -1, 1);
  const double a = m.loss(tokens, targets).item<double>();
  m.set_activation_checkpointing(ActivationCheckpointing::None);
  EXPECT_DOUBLE_EQ(a, m.loss(tokens, targets).item<double>());
}

}  // namespace
}  // namespace meshtrain
