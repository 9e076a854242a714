// Expert parallelism (device_config.expert_parallel): the routed experts split
// over ranks of the dp group, tokens moved by all-to-all. Every mesh with
// expert_parallel in {1, 2, 4}, with tp, pp, sequence parallelism, ZeRO-1 and
// activation checkpointing, gives the losses and gradient norms of one
// process -- dropless (capacity_factor 0) and with a capacity (drops are per
// sequence, so they do not depend on the mesh); the all-to-all traffic equals
// the formulas written next to the test; checkpoints reshard across
// expert_parallel sizes. Runs under mpirun -np 2, 4 and 8.
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/parallel/expert_parallel.h"
#include "meshtrain/perf/op_observer.h"
#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("ep-data");

// The tiny MLA + MoE model with 8 experts (so expert_parallel 4 holds 2 per
// rank), top-2, one shared expert.
Config moe(const std::string& name, double capacity_factor) {
  Config c = test::moe_mla(test::tiny_config(test::synthetic_data(kData, 96), name));
  c.model.n_experts = 8;
  c.model.capacity_factor = capacity_factor;
  c.training_steps = 3;
  return c;
}

struct EpMesh {
  int dp, pp, tp, ep;
  bool sp = false, recompute = false, zero = false;
  std::string str() const {
    return "dp" + std::to_string(dp) + " pp" + std::to_string(pp) + " tp" + std::to_string(tp) + " ep" +
           std::to_string(ep) + (sp ? " sp" : "") + (recompute ? " recompute" : "") + (zero ? " zero1" : "");
  }
};

Config on(Config c, const EpMesh& m) {
  c = test::with_mesh(c, m.dp, m.pp, m.tp);
  c.device.expert_parallel = m.ep;
  c.sequence_parallel = m.sp;
  c.activation_checkpointing = m.recompute ? ActivationCheckpointing::Full : ActivationCheckpointing::None;
  c.zero_stage = m.zero ? 1 : 0;
  if (m.pp > 1) c.data.micro_batch_size = c.data.train_batch_size / m.dp / 2;
  c.name += "-" + std::to_string(m.dp) + std::to_string(m.pp) + std::to_string(m.tp) + std::to_string(m.ep) +
            (m.sp ? "s" : "") + (m.recompute ? "r" : "") + (m.zero ? "z" : "");
  return c;
}

// The meshes each world size runs (every one with expert_parallel > 1 but
// one, the ep = 1 baseline of the same dp).
std::vector<EpMesh> meshes(int n) {
  if (n == 2) return {{2, 1, 1, 2}, {2, 1, 1, 1}};
  if (n == 4)
    return {{4, 1, 1, 4}, {4, 1, 1, 2, false, false, true}, {2, 1, 2, 2, true, true}, {2, 2, 1, 2}};
  if (n == 8) return {{4, 1, 2, 4, true}, {2, 2, 2, 2, false, true, true}, {8, 1, 1, 4}};
  return {};
}

void expect_parity(const Config& base) {
  const int n = test_runtime().size();
  const auto ref = test::single_process_losses(base);
  for (const EpMesh& m : meshes(n)) {
    SCOPED_TRACE(m.str());
    // Backward (the exchanges' reverse all-to-alls) on its own thread, as on CUDA.
    const auto got = test::train_losses(on(base, m), /*backward_thread=*/true);
    // Expert rows batch differently per mesh (different GEMM shapes): fp32 round-off only.
    test::expect_same_curve(ref, got, 2e-5, "expert parallel " + m.str());
  }
}

}  // namespace

TEST(ExpertParallel, DroplessMeshesMatchOneProcess) { expect_parity(moe("ep-dropless", 0.0)); }

// capacity_factor 1: tight, so assignments are dropped -- per sequence, the
// same ones on every mesh.
TEST(ExpertParallel, CapacityMeshesMatchOneProcess) { expect_parity(moe("ep-capacity", 1.0)); }

// Bytes on the ep communicator in one train_step, counted as comm.h counts
// them (the input of each exchange), with L_moe MoE layers on this rank's
// stage, d the model dimension, fp32 activations.
//
// With a capacity (static slots): per MoE layer the dispatch sends the slot
// buffer [E, S, d] (S = B * C slots per expert, B this rank's sequences,
// C = ceil(cf * T * k / E)) and the combine the same number of rows back;
// backward repeats both:
//     bytes = L_moe * 4 * E * B * C * d * 4                         (per rank)
// Dropless (by counts): the dispatch sends every assignment's row (B*T*k of
// them per rank), the combine returns as many rows over the group, backward
// repeats both, and the forward first exchanges the E int64 counts:
//     sum over the ep group = L_moe * ep * (4 * B * T * k * d * 4 + E * 8)
TEST(ExpertParallelTraffic, AllToAllBytesEqualTheFormula) {
  const int n = test_runtime().size();
  for (double cf : {1.25, 0.0}) {
    Config cfg = on(moe(cf > 0 ? "ep-traffic-cap" : "ep-traffic-dropless", cf), EpMesh{n, 1, 1, n});
    SessionOptions o;
    o.fresh = true;
    o.quiet = true;
    Trainer t(cfg, test_runtime(), o);
    t.train_step();  // the first step allocates everything; measure the second
    t.mesh().reset_bytes();
    t.train_step();
    const ModelConfig& m = cfg.model;
    int64_t L = 0;
    for (int64_t i = 0; i < m.n_layers(); ++i) L += is_moe_layer(m, i) ? 1 : 0;
    const int64_t B = cfg.data.train_batch_size / n, T = m.T, d = m.model_dimension, E = m.n_experts, k = m.k;
    Communicator& ep = t.mesh().ep();
    std::string ops;
    for (const auto& [op, b] : ep.bytes_by_op()) ops += op + "=" + std::to_string(b) + " ";
    SCOPED_TRACE(ops);
    if (cf > 0) {
      const auto C = static_cast<int64_t>(std::ceil(cf * static_cast<double>(T * k) / static_cast<double>(E)));
      EXPECT_EQ(ep.bytes_moved(), L * 4 * E * B * C * d * 4);
    } else {
      at::Tensor total = at::full({1}, ep.bytes_moved(), at::kLong);
      t.mesh().cpu_world().all_reduce(total);  // one ep group spans the world here
      EXPECT_EQ(total.item<int64_t>(), L * n * (4 * B * T * k * d * 4 + E * 8));
    }
    // Nothing but the exchanges: tp and pp are 1, and the dp sums come after.
    EXPECT_EQ(t.mesh().tp().bytes_moved() + t.mesh().pp().bytes_moved(), 0);
  }
}

// Save on expert_parallel 2, resume on expert_parallel 4 and 1 (and ZeRO-1):
// the continuation matches one process that never stopped; inspect shows the
// experts split over expert_parallel.
TEST(ExpertParallelCheckpoint, ReshardsAcrossExpertParallelSizes) {
  auto world = test_runtime().world();
  if (world->size() != 4) GTEST_SKIP() << "runs under mpirun -np 4 (this is -np " << world->size() << ")";
  Config c = moe("ep-reshard", 0.0);
  c.training_steps = 6;
  c.checkpoint_steps = 3;
  const auto ref = test::single_process_losses(c);
  for (const EpMesh& next : {EpMesh{4, 1, 1, 4}, EpMesh{4, 1, 1, 1, false, false, true}}) {
    SCOPED_TRACE("resume on " + next.str());
    Config first = on(c, EpMesh{4, 1, 1, 2});
    first.name = "ep-reshard-to-ep" + std::to_string(next.ep) + (next.zero ? "-zero" : "");
    first.training_steps = 3;
    test::train_losses(first);
    if (world->rank() == 0) {
      const std::string text = inspect_checkpoint(first.run_dir() + "/checkpoints/step_00000003");
      EXPECT_NE(text.find("model.layers.0.moe.experts.w_in  [8, 32, 32]  F32  experts (dim 0) in 2"), std::string::npos)
          << text;
    }
    Config second = on(c, next);
    second.name = first.name;
    SessionOptions o;
    o.quiet = true;
    Trainer t(second, test_runtime(), o);
    t.train();
    const auto& cont = t.losses();
    ASSERT_EQ(cont.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(cont[i], ref[3 + i], 2e-5) << "step " << 4 + i;
  }
}

// A mesh the config cannot split names the key.
TEST(ExpertParallel, BadExpertParallelNamesTheKey) {
  const int n = test_runtime().size();
  Config c = on(moe("ep-bad", 0.0), EpMesh{n, 1, 1, 1});
  c.device.expert_parallel = 3;
  SessionOptions o;
  o.fresh = true;
  o.quiet = true;
  try {
    Trainer t(c, test_runtime(), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device_config.expert_parallel"), std::string::npos) << e.what();
  }
}

// The dropless exchange on its own, over the world: every row comes back in
// its place, computed by the right local expert, with the right gradient; and
// the dispatch reads nothing on the host but its one copy of the split sizes
// (no bincount, item, nonzero or repeat_interleave; a `.cpu()` of the splits
// is no op on CPU tensors, so what the observer sees here is the rest).
TEST(ExpertParallelExchange, DevicePermutationAndNoOtherHostReads) {
  auto world = test_runtime().world();
  const int64_t ep = world->size(), local = 2, E = ep * local, M = 37, d = 3;
  auto dispatcher = make_all_to_all_dispatcher(*world);
  at::manual_seed(11 + world->rank());
  const at::Tensor expert = std::get<0>(at::randint(0, E, {M}, at::kLong).sort());
  const at::Tensor rows = at::randn({M, d}).requires_grad_(true);
  at::Tensor seen_counts, seen_expert, seen_sender, out;
  {
    OpObserver obs(at::Device(at::kCPU));
    out = dispatcher->run_experts(
        rows, expert, E,
        [&](const at::Tensor& in, const at::Tensor& counts, const at::Tensor& row_expert, const at::Tensor& sender) {
          seen_counts = counts;
          seen_expert = row_expert;
          seen_sender = sender;
          return in * (row_expert + 1).unsqueeze(1).to(in.scalar_type());
        });
    out.sum().backward();
    for (const auto& [op, row] : obs.totals().by_op)
      if (op.find("(host sync)") != std::string::npos)
        EXPECT_EQ(op, "aten::copy_ (host sync)") << "the exchange read the device: " << row.calls << " x " << op;
  }
  // Rows grouped by local expert, as the counts say.
  EXPECT_TRUE(at::equal(seen_expert, at::repeat_interleave(at::arange(local), seen_counts)));
  const at::Tensor factor = (at::remainder(expert, local) + 1).unsqueeze(1).to(at::kFloat);
  EXPECT_TRUE(at::allclose(out, rows.detach() * factor));
  EXPECT_TRUE(at::allclose(rows.grad(), factor.expand({M, d})));
  // Every rank's rows for my experts arrived: the counts sum to what was sent here.
  at::Tensor mine = at::zeros({E}, at::kLong).scatter_add_(0, expert, at::ones_like(expert));
  world->all_reduce(mine);
  EXPECT_TRUE(at::equal(seen_counts, mine.view({ep, local})[world->rank()]));
  // Within an expert the rows come by sender (FP8's scale groups), each
  // sender's as many as it sent.
  const at::Tensor block = seen_expert * ep + seen_sender;
  EXPECT_TRUE(at::equal(block, std::get<0>(block.sort())));
  at::Tensor sent = at::zeros({ep, E}, at::kLong);
  sent[world->rank()].scatter_add_(0, expert, at::ones_like(expert));
  world->all_reduce(sent);
  const at::Tensor from = sent.narrow(1, world->rank() * local, local).t().reshape({-1});  // [local, ep]
  EXPECT_TRUE(at::equal(at::zeros({local * ep}, at::kLong).scatter_add_(0, block, at::ones_like(block)), from));
}
