// DeepSeek-V3's auxiliary-loss-free balancing (model_config.router_bias,
// router_bias_update_rate) through the real Trainer: on a router skewed so
// that two of four experts get every token, the bias update balances the
// loads (MaxVio, as metrics.jsonl reports it) within a few hundred steps
// while the aux loss alone does not, a multi-token prediction module's router
// too; the bias is identical on every rank of a mesh; checkpoints carry it.
// Runs under mpirun -np 1, 2 and 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "meshtrain/model/moe.h"
#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("router-bias-data");

// Two MoE layers of 4 experts, top-2, dropless, with biases on the linears
// so the router has a bias to skew.
Config toy_moe(const std::string& name) {
  Config c = test::tiny_config(test::synthetic_data(kData, 96), name);
  c.model.ffn = FfnKind::Moe;
  c.model.n_experts = 4;
  c.model.k = 2;
  c.model.capacity_factor = 0.0;
  c.model.mlp_hidden = 32;
  c.model.blocks = 1;
  c.model.layers_per_block = 2;
  c.model.linear_bias = true;
  c.data.train_batch_size = 64;  // 1024 tokens a step: loads vary little from batch to batch
  c.alpha = 0.0;
  return c;
}

Config with_bias_balancing(Config c, double rate) {
  c.model.router_bias = true;
  c.model.router_bias_update_rate = rate;
  return c;
}

// Every router starts with logit bias kSkew on experts 0 and 1, far above the
// logits' spread from the weights (std ~0.1), so those two take every token.
constexpr double kSkew = 2.0;

void skew_routers(Trainer& t) {
  at::NoGradGuard no_grad;
  int skewed = 0;
  for (auto& p : t.model().params) {
    const std::string& n = p.layout.global_name;
    const std::string suffix = ".moe.router.bias";
    if (n.size() < suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    p.tensor.zero_();
    p.tensor.narrow(0, 0, 2).fill_(kSkew);
    ++skewed;
  }
  ASSERT_GT(skewed, 0) << "no MoE router bias found to skew";
}

// MaxVio per logged step and MoE layer, as metrics.jsonl reports it.
std::vector<std::vector<double>> max_vio_of(const Config& c) {
  std::ifstream in(c.run_dir() + "/metrics.jsonl");
  EXPECT_TRUE(in) << c.run_dir() << "/metrics.jsonl";
  std::vector<std::vector<double>> rows;
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("max_vio")) rows.push_back(row["max_vio"].get<std::vector<double>>());
  }
  return rows;
}

// A Trainer that has trained c from scratch on one process with skewed routers.
std::unique_ptr<Trainer> trained_skewed(const Config& c) {
  std::filesystem::remove_all(c.run_dir());  // metrics.jsonl of an earlier run of the test
  SessionOptions o;
  o.fresh = true;
  o.quiet = true;
  auto t = std::make_unique<Trainer>(c, test_runtime(), o);
  skew_routers(*t);
  t->train();
  return t;
}

// MaxVio per step and layer of trained_skewed(c).
std::vector<std::vector<double>> train_skewed(const Config& c) {
  trained_skewed(c);
  return max_vio_of(c);
}

// The mean over the last `window` steps, per layer.
std::vector<double> tail_mean(const std::vector<std::vector<double>>& rows, size_t window) {
  std::vector<double> mean(rows.back().size(), 0.0);
  for (size_t s = rows.size() - window; s < rows.size(); ++s)
    for (size_t l = 0; l < mean.size(); ++l) mean[l] += rows[s][l] / static_cast<double>(window);
  return mean;
}

std::string str(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += std::to_string(x) + " ";
  return s;
}

}  // namespace

// The same 300 steps, learning rate and data for both runs: the bias (rate
// 0.002, no aux loss) against the aux loss alone at alpha 0.01 (the tiny
// configs' value; no bias). "Balanced" is the mean MaxVio of the last 50
// steps, per layer: a single step's MaxVio still moves by about 0.1 from
// batch to batch at 1024 tokens a step.
//
// Measured (seed 0): the bias gets below 0.2 by step ~75 and ends at
// 0.10 / 0.06 (layers 0 / 1); the aux loss alone ends at 0.66 / 0.49. Seeds
// 1-3 and rates 0.001-0.01 pass too. The aux loss is not hopeless: at alpha
// 0.1 it reaches 0.06 here. This test claims the weak-aux-loss case that
// DeepSeek-V3's balancing exists for, not every alpha.
TEST(RouterBias, BalancesASkewedRouterWhereTheAuxLossAloneDoesNot) {
  if (test_runtime().size() != 1) GTEST_SKIP() << "runs under mpirun -np 1";
  constexpr int64_t kSteps = 300;
  constexpr size_t kWindow = 50;
  Config base = toy_moe("rb-balance");
  base.training_steps = kSteps;
  base.checkpoint_steps = kSteps;
  base.lr.warmup_steps = 10;
  base.lr.end_steps = kSteps;
  Config biased = with_bias_balancing(base, 0.002);
  biased.name = "rb-balance-bias";
  Config aux = base;
  aux.alpha = 0.01;
  aux.name = "rb-balance-aux";

  const auto with_bias = train_skewed(biased);
  const auto aux_only = train_skewed(aux);
  ASSERT_EQ(with_bias.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(aux_only.size(), static_cast<size_t>(kSteps));
  // The skew took: experts 0 and 1 of 4 get every token, MaxVio 4 / 2 - 1 = 1.
  for (const auto* run : {&with_bias, &aux_only})
    for (double v : run->front()) EXPECT_DOUBLE_EQ(v, 1.0) << "the skewed router should start with all on 2 experts";

  const auto bias_end = tail_mean(with_bias, kWindow), aux_end = tail_mean(aux_only, kWindow);
  std::printf("MaxVio per MoE layer, mean of steps %lld-%lld: bias %s| aux loss only %s\n",
              static_cast<long long>(kSteps - kWindow + 1), static_cast<long long>(kSteps), str(bias_end).c_str(),
              str(aux_end).c_str());
  for (size_t l = 0; l < bias_end.size(); ++l) {
    EXPECT_LT(bias_end[l], 0.2) << "MoE layer " << l << ": the bias update should balance the skewed router";
    EXPECT_GT(aux_end[l], 0.2) << "MoE layer " << l << ": the aux loss alone (alpha 0.01) balanced it: "
                               << "the comparison no longer shows what the bias adds";
  }
}

// A multi-token prediction module of an MoE model is an MoE layer (layer
// n_layers + j, model/mtp.h) with its own router and score bias: the step
// counts its experts (expert_load's last row) and the bias update balances
// it as it does the main layers. Its router starts skewed like theirs; after
// step 1 (experts 0 and 1 took every assignment) its bias is exactly
// -rate, -rate, +rate, +rate, and at rate 0.01 the module's MaxVio falls
// from 1 to below 0.3 (the mean of steps 71-100; measured 0.18, seed 0).
// With the modules' routers left out, their bias stays 0 and MaxVio 1.
TEST(RouterBias, BalancesTheMultiTokenPredictionModulesRouter) {
  if (test_runtime().size() != 1) GTEST_SKIP() << "runs under mpirun -np 1";
  constexpr double kRate = 0.01;
  Config c = with_bias_balancing(toy_moe("rb-mtp"), kRate);
  c.model.mtp_depth = 1;
  c.model.mtp_loss_weight = 0.3;
  c.lr.warmup_steps = 5;
  c.lr.end_steps = 100;
  for (const int64_t steps : {1, 100}) {
    c.training_steps = steps;
    c.name = "rb-mtp-" + std::to_string(steps);
    const std::unique_ptr<Trainer> t = trained_skewed(c);
    const auto rows = max_vio_of(c);
    ASSERT_EQ(rows.size(), static_cast<size_t>(steps));
    ASSERT_EQ(rows.front().size(), 3u) << "MaxVio of the 2 layers and the module";
    EXPECT_DOUBLE_EQ(rows.front().back(), 1.0) << "the module's skewed router should start with all on 2 experts";
    if (steps == 1) {
      int found = 0;
      for (auto& p : t->model().params) {
        if (p.layout.global_name != "mtp.0.block.moe.score_bias") continue;
        ++found;
        const at::Tensor want = at::tensor({-kRate, -kRate, kRate, kRate}, p.tensor.options());
        EXPECT_TRUE(at::allclose(p.tensor.detach(), want)) << "the module's score bias: " << p.tensor;
      }
      EXPECT_EQ(found, 1) << "mtp.0.block.moe.score_bias";
    } else {
      const double end = tail_mean(rows, 30).back();
      std::printf("the module's MaxVio, mean of steps 71-100: %.3f\n", end);
      EXPECT_LT(end, 0.3) << "the bias update should balance the module's skewed router";
    }
  }
}

// The loads are the step's global counts, so every rank that holds a layer
// makes the same update: compare each rank's bias with its dp and tp peers'
// (pp stages hold different layers), under expert and sequence parallelism.
TEST(RouterBias, IdenticalOnEveryRank) {
  const int n = test_runtime().size();
  if (n == 1) GTEST_SKIP() << "runs under mpirun -np 2 and 4";
  struct M {
    int dp, pp, tp, ep;
    bool sp;
  };
  const std::vector<M> meshes = n == 2 ? std::vector<M>{{2, 1, 1, 2, false}, {1, 1, 2, 1, true}}
                                       : std::vector<M>{{2, 1, 2, 2, true}, {2, 2, 1, 2, false}};
  for (const M& m : meshes) {
    Config c = with_bias_balancing(toy_moe("rb-ranks"), 0.01);
    c.model.mtp_depth = 1;  // an MoE module on the last stage: its bias too
    c = test::with_mesh(c, m.dp, m.pp, m.tp);
    c.device.expert_parallel = m.ep;
    c.sequence_parallel = m.sp;
    if (m.pp > 1) c.data.micro_batch_size = c.data.train_batch_size / m.dp / 2;
    c.training_steps = 5;
    c.name += "-" + std::to_string(m.dp) + std::to_string(m.pp) + std::to_string(m.tp) + std::to_string(m.ep);
    SCOPED_TRACE(c.name);
    SessionOptions o;
    o.fresh = true;
    o.quiet = true;
    Trainer t(c, test_runtime(), o);
    skew_routers(t);
    t.train();
    int checked = 0;
    for (auto& p : t.model().params) {
      if (p.layout.global_name.find(".moe.score_bias") == std::string::npos) continue;
      const at::Tensor mine = p.tensor.detach().clone();
      EXPECT_GT(mine.abs().max().item<double>(), 0.0) << p.layout.global_name << " never moved";
      for (Communicator* peers : {&t.mesh().dp(), &t.mesh().tp()}) {
        at::Tensor root = mine.clone();
        peers->broadcast(root, 0);
        EXPECT_TRUE(at::equal(mine, root)) << p.layout.global_name << " differs from its peers': " << mine << root;
      }
      ++checked;
    }
    EXPECT_GT(checked, 0);
  }
}

// A checkpoint saves the bias and a resumed run starts from it.
TEST(RouterBias, SavedAndRestoredByCheckpoints) {
  const int n = test_runtime().size();
  Config c = with_bias_balancing(toy_moe("rb-ckpt-np" + std::to_string(n)), 0.01);
  c = test::with_mesh(c, n, 1, 1);
  c.training_steps = 4;
  c.checkpoint_steps = 4;
  std::map<std::string, at::Tensor> saved;
  {
    SessionOptions o;
    o.fresh = true;
    o.quiet = true;
    Trainer t(c, test_runtime(), o);
    skew_routers(t);
    t.train();
    for (auto& p : t.model().params)
      if (p.layout.global_name.find(".moe.score_bias") != std::string::npos)
        saved[p.layout.global_name] = p.tensor.detach().clone();
  }
  ASSERT_EQ(saved.size(), 2u);
  SessionOptions o;
  o.quiet = true;
  Trainer resumed(c, test_runtime(), o);
  ASSERT_EQ(resumed.step(), 4);
  for (auto& p : resumed.model().params) {
    const auto it = saved.find(p.layout.global_name);
    if (it == saved.end()) continue;
    EXPECT_GT(it->second.abs().max().item<double>(), 0.0) << it->first << " never moved";
    EXPECT_TRUE(at::equal(p.tensor, it->second)) << it->first << ": " << p.tensor << " vs saved " << it->second;
  }
}
