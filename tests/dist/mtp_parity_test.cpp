// Multi-token prediction (model_config.mtp_depth, model/mtp.h) on every mesh:
// dp, tp with and without sequence parallelism, context parallelism (the
// shifted tokens cut before the chunks), ZeRO-1, FSDP (zero_stage 3), expert
// parallelism, activation recomputation and pipeline parallelism (the last
// stage's embedding copy; pp 4, and pp 2 with dp, tp, cp or ep) give one
// process's losses, gradient norms and per-depth MTP losses (metrics.jsonl's
// mtp_loss), for the DeepSeek-V3-style MLA + MoE model with D = 2 and packed
// documents: fp32 within 2e-5, bf16 within 2 bf16 roundings (bf16_test.cpp's
// kMesh) of one bf16 process; so do the evaluation's per-depth losses
// (val_mtp_loss) after the last step. Its MTP modules are MoE layers whose score
// biases move with the main layers' (router_bias): equal to one process's
// after the run. Runs under mpirun -np 2 and 4.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "meshtrain/model/moe.h"
#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("mtp-data");

Config mtp(const std::string& name) {
  Config c = test::deepseek_v3(test::tiny_config(test::synthetic_data(kData, 96), name));
  c.model.capacity_factor = 0;  // dropless: no drop depends on how tokens group
  c.model.mtp_depth = 2;
  c.model.mtp_loss_weight = 0.5;
  // Documents end at token 7: the MTP targets stop at each end.
  c.data.document_masking = true;
  c.data.eot_token = 7;
  c.training_steps = 3;
  return c;
}

struct MtpMesh {
  int dp, tp, ep = 1, zero = 0;
  bool sp = false, recompute = false;
  int cp = 1, pp = 1;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  std::string str() const {
    return "dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " cp" + std::to_string(cp) + " ep" +
           std::to_string(ep) + " zero" + std::to_string(zero) + (sp ? " sp" : "") + (recompute ? " recompute" : "") +
           " pp" + std::to_string(pp) + " schedule " + std::to_string(static_cast<int>(schedule));
  }
};

Config on(Config c, const MtpMesh& m) {
  c = test::with_mesh(c, m.dp, m.pp, m.tp);
  c.device.expert_parallel = m.ep;
  c.device.context_parallel = m.cp;
  c.zero_stage = m.zero;
  c.sequence_parallel = m.sp;
  c.activation_checkpointing = m.recompute ? ActivationCheckpointing::Full : ActivationCheckpointing::None;
  c.pipeline_schedule = m.schedule;
  c.virtual_stages = m.schedule == PipelineSchedule::Interleaved ? 2 : 1;
  c.name += "-" + std::to_string(m.dp) + std::to_string(m.tp) + std::to_string(m.cp) + std::to_string(m.ep) +
            std::to_string(m.zero) + (m.sp ? "s" : "") + (m.recompute ? "r" : "") + "p" + std::to_string(m.pp) +
            "s" + std::to_string(static_cast<int>(m.schedule));
  return c;
}

std::vector<MtpMesh> meshes(int n) {
  if (n == 2)
    return {{2, 1}, {1, 2}, {1, 2, 1, 0, true}, {2, 1, 2, 1}, {2, 1, 1, 3, false, true}, {1, 1, 1, 0, false, false, 2}};
  if (n == 4) return {{2, 2, 2, 1, true, true}, {4, 1, 4, 3}, {1, 2, 2, 0, true, false, 2}, {2, 1, 4, 1, false, true, 2}};
  return {};
}

// Pipeline parallelism: the modules on the last stage read its copy of the
// embedding (summed with the first stage's over pp); zbv's V keeps both on
// stage 0. The 4 layers fill the interleaved and V chunks at pp 2.
std::vector<MtpMesh> pp_meshes(int n) {
  using S = PipelineSchedule;
  MtpMesh one_f{1, 1}, interleaved{1, 1}, zb{1, 1}, zbv{1, 1};
  one_f.pp = interleaved.pp = zb.pp = zbv.pp = 2;
  interleaved.schedule = S::Interleaved;
  zb.schedule = S::ZbH1;
  zbv.schedule = S::Zbv;
  if (n == 2) return {one_f, interleaved, zb, zbv};
  MtpMesh zero1{2, 1, 1, 1}, zero3{2, 1, 1, 3}, tp_sp{1, 2, 1, 0, true}, interleaved_dp{2, 1};
  zero1.pp = zero3.pp = tp_sp.pp = interleaved_dp.pp = 2;
  interleaved_dp.schedule = S::Interleaved;
  if (n == 4) return {zero1, zero3, tp_sp, interleaved_dp};
  return {};
}

// np 4 only: pp 4 (one layer a stage; zbv's V needs 2 * pp = 8 layers, so
// its own model) and pp 2 with context or expert parallelism.
std::vector<MtpMesh> more_pp_meshes(int n, bool zbv) {
  if (n != 4) return {};
  MtpMesh pp4{1, 1}, cp{1, 1}, ep{2, 1, 2};
  pp4.pp = 4;
  if (zbv) {
    pp4.schedule = PipelineSchedule::Zbv;
    return {pp4};
  }
  cp.cp = cp.pp = ep.pp = 2;
  return {pp4, cp, ep};
}

// The per-depth MTP losses of every training row of a run's metrics.jsonl
// (key mtp_loss), or of its evaluation rows (val_mtp_loss).
std::vector<std::vector<double>> mtp_rows(const Config& c, const std::string& key = "mtp_loss") {
  std::ifstream in(c.run_dir() + "/metrics.jsonl");
  std::vector<std::vector<double>> rows;
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains(key)) rows.push_back(row[key].get<std::vector<double>>());
  }
  return rows;
}

// expert_load of every training row: per MoE layer, the modules' last.
std::vector<std::vector<std::vector<double>>> load_rows(const Config& c) {
  std::ifstream in(c.run_dir() + "/metrics.jsonl");
  std::vector<std::vector<std::vector<double>>> rows;
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("expert_load")) rows.push_back(row["expert_load"].get<std::vector<std::vector<double>>>());
  }
  return rows;
}

// The expert loads each step counted, summed over the mesh: one process's
// (fp32: a token whose routing flips on rounding moves a load by 1 / 256,
// the step's 128 tokens x top-2).
void expect_same_loads(const Config& ref, const Config& got, const ModelConfig& m) {
  const auto want = load_rows(ref), have = load_rows(got);
  ASSERT_EQ(have.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(have[s].size(), want[s].size());
    for (size_t l = 0; l < want[s].size(); ++l)
      for (size_t e = 0; e < want[s][l].size(); ++e)
        EXPECT_NEAR(have[s][l][e], want[s][l][e], 1.5 / 256) << "step " << s + 1 << " MoE layer " << l << " expert " << e;
  }
  if (m.ffn != FfnKind::Moe || want.empty()) return;
  size_t moe = 0;
  for (int64_t i = 0; i < m.n_layers() + m.mtp_depth; ++i) moe += is_moe_layer(m, i);
  EXPECT_EQ(want[0].size(), moe) << "expert_load: the MoE layers, the modules' included";
}

void expect_meshes_match(const Config& base, double tol, bool relative, const std::vector<MtpMesh>& all) {
  const auto ref = test::single_process_losses(base);
  Config ref_cfg = base;
  ref_cfg.name += "-ref-rank" + std::to_string(test_runtime().rank());
  const auto ref_mtp = mtp_rows(ref_cfg);
  ASSERT_EQ(ref_mtp.size(), static_cast<size_t>(base.training_steps));
  ASSERT_EQ(ref_mtp[0].size(), 2u);
  // The evaluation after the last step: the modules' validation losses.
  const auto ref_val = mtp_rows(ref_cfg, "val_mtp_loss");
  ASSERT_EQ(ref_val.size(), 1u);
  ASSERT_EQ(ref_val[0].size(), 2u);
  for (double l : ref_val[0]) EXPECT_TRUE(std::isfinite(l) && l > 0) << "val_mtp_loss " << l;
  ASSERT_FALSE(all.empty()) << "no meshes for " << test_runtime().size() << " ranks";
  for (const MtpMesh& m : all) {
    SCOPED_TRACE(m.str());
    const Config c = on(base, m);
    const auto got = test::train_losses(c, /*backward_thread=*/true);
    if (relative) {
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_NEAR(ref[i], got[i], tol * std::abs(ref[i])) << "loss of step " << i + 1;
        EXPECT_NEAR(ref.grad_norms[i], got.grad_norms[i], tol * std::abs(ref.grad_norms[i])) << "norm of step " << i + 1;
      }
    } else {
      test::expect_same_curve(ref, got, tol, "mtp " + m.str());
    }
    if (test_runtime().rank() != 0) continue;  // rank 0 writes metrics.jsonl
    const auto rows = mtp_rows(c), val = mtp_rows(c, "val_mtp_loss");
    ASSERT_EQ(rows.size(), ref_mtp.size());
    for (size_t s = 0; s < rows.size(); ++s)
      for (size_t k = 0; k < 2; ++k)
        EXPECT_NEAR(rows[s][k], ref_mtp[s][k], relative ? tol * std::abs(ref_mtp[s][k]) : tol)
            << "step " << s + 1 << " depth " << k + 1;
    if (!relative) expect_same_loads(ref_cfg, c, base.model);
    ASSERT_EQ(val.size(), 1u);
    ASSERT_EQ(val[0].size(), 2u);
    for (size_t k = 0; k < 2; ++k)
      EXPECT_NEAR(val[0][k], ref_val[0][k], relative ? tol * std::abs(ref_val[0][k]) : tol)
          << "val_mtp_loss depth " << k + 1;
  }
}

}  // namespace

TEST(Mtp, EveryMeshMatchesOneProcess) { expect_meshes_match(mtp("mtp"), 2e-5, false, meshes(test_runtime().size())); }

// pp 2 (np 2: 1f1b, interleaved, zb-h1, zbv; np 4: with dp 2 and ZeRO-1 or
// FSDP, with tp 2 + sp, interleaved with dp 2) for the MLA + MoE model and a
// dense one, each with a tied and an untied head: the untied last stage holds
// the embedding copy for the modules alone.
TEST(Mtp, PipelineMeshesMatchOneProcess) {
  for (const bool dense : {false, true}) {
    for (const bool tied : {true, false}) {
      SCOPED_TRACE(std::string(dense ? "dense" : "mla+moe") + (tied ? " tied" : " untied"));
      Config c = mtp(std::string("mtp-pp") + (dense ? "-dense" : "") + (tied ? "-tied" : "-untied"));
      if (dense) {
        Config d = test::tiny_config(kData, c.name);
        d.model.mtp_depth = c.model.mtp_depth;
        d.model.mtp_loss_weight = c.model.mtp_loss_weight;
        d.data.document_masking = true;
        d.data.eot_token = 7;
        d.training_steps = c.training_steps;
        c = d;
      }
      c.model.tie_embeddings = tied;
      c.data.micro_batch_size = 2;  // microbatches to pipeline (interleaved: a multiple of pp per rank)
      expect_meshes_match(c, 2e-5, false, pp_meshes(test_runtime().size()));
    }
  }
}

// pp 4 (1f1b; zbv on 8 layers) and pp 2 x cp 2, pp 2 x dp 2 with ep 2 (np 4).
TEST(Mtp, MorePipelineMeshesMatchOneProcess) {
  if (test_runtime().size() != 4) GTEST_SKIP() << "runs under mpirun -np 4";
  for (const bool zbv : {false, true}) {
    Config c = mtp(zbv ? "mtp-pp4-zbv" : "mtp-pp-more");
    c.model.tie_embeddings = false;  // the last stage's copy serves the modules alone
    c.data.micro_batch_size = 2;     // 4 microbatches: pp 4 pipelines them
    if (zbv) c.model.blocks = 4;     // 8 layers: two chunks on each of 4 stages
    SCOPED_TRACE(c.name);
    expect_meshes_match(c, 2e-5, false, more_pp_meshes(test_runtime().size(), zbv));
  }
}

// bf16 mixed precision: within two bf16 roundings of one bf16 process
// (relative), also under pp 2 (np 2: 1f1b; np 4: with dp 2).
TEST(Mtp, Bf16MeshesMatchOneBf16Process) {
  Config c = mtp("mtp-bf16");
  c.model.model_dtype = ModelDtype::Bfloat16;
  expect_meshes_match(c, 2.0 / 256, true, meshes(test_runtime().size()));
  c.name = "mtp-bf16-pp";
  c.data.micro_batch_size = 2;
  MtpMesh pp{test_runtime().size() / 2, 1};
  pp.pp = 2;
  expect_meshes_match(c, 2.0 / 256, true, {pp});
}

// The score biases of every MoE router (the modules', mtp.*, among them),
// by name, after training c from scratch: on this mesh, or (alone) on one
// process inside every rank.
std::map<std::string, at::Tensor> trained_biases(Config c, bool alone) {
  SessionOptions o;
  o.fresh = true;
  o.quiet = true;
  o.backward_thread = true;
  std::unique_ptr<Communicator> self;
  if (alone) {
    c.device.n_device_axis = {1, 1, 1};
    c.device.expert_parallel = 1;
    c.name += "-ref-rank" + std::to_string(test_runtime().rank());
    self = split_communicator(*test_runtime().world(), test_runtime().rank(), 0);
  }
  Trainer t(c, test_runtime(), o, self.get());
  t.train();
  std::map<std::string, at::Tensor> out;
  for (auto& p : t.model().params)
    if (p.layout.router_score_bias) out[p.layout.global_name] = p.tensor.detach().clone();
  return out;
}

// DeepSeek-V3's balancing moves the modules' biases from their own expert
// loads, counted over the whole mesh: after 3 steps every rank holding a
// router has one process's bias, the modules' included (moved: with the
// modules' routers left out they stay 0). np 2: dp 2 x ep 2, pp 2;
// np 4: dp 2 x pp 2 x ep 2, dp 2 x tp 2 + sp x ep 2.
TEST(Mtp, RouterBiasesMatchOneProcess) {
  Config base = mtp("mtp-bias");
  base.data.micro_batch_size = 2;  // microbatches to pipeline, the same on one process
  const auto ref = trained_biases(base, true);
  for (int64_t j = 0; j < base.model.mtp_depth; ++j) {
    const std::string name = "mtp." + std::to_string(j) + ".block.moe.score_bias";
    ASSERT_TRUE(ref.count(name)) << name;
    EXPECT_GT(ref.at(name).abs().max().item<double>(), 0.0) << name << " never moved";
  }
  const int n = test_runtime().size();
  MtpMesh a{2, 1, 2}, b{1, 1};
  b.pp = 2;
  if (n == 4) {
    a = {2, 2, 2, 0, true};
    b = {2, 1, 2};
    b.pp = 2;
  }
  for (const MtpMesh& m : {a, b}) {
    SCOPED_TRACE(m.str());
    const Config c = on(base, m);
    const auto got = trained_biases(c, false);
    size_t mtp_biases = 0;
    for (const auto& [name, bias] : got) {
      ASSERT_TRUE(ref.count(name)) << name;
      EXPECT_TRUE(at::allclose(bias, ref.at(name), 0, 1e-6)) << name << ": " << bias << " vs one process's "
                                                               << ref.at(name);
      mtp_biases += name.rfind("mtp.", 0) == 0;
    }
    // The last stage holds the modules (pp 2: this rank's stage may not).
    if (m.pp == 1 || test_runtime().rank() == n - 1)
      EXPECT_EQ(mtp_biases, static_cast<size_t>(base.model.mtp_depth));
  }
}

// A checkpoint holds the modules and their moments: a run resumed from step 2
// continues with the losses of the uninterrupted run.
void expect_resumes_exactly(const Config& base, const MtpMesh& mesh) {
  Config full = on(base, mesh);
  full.training_steps = 4;
  const auto ref = test::run_losses(full, true);
  Config half = full;
  half.name += "-half";
  half.training_steps = 2;
  half.checkpoint_steps = 2;
  test::run_losses(half, true);
  Config next = full;
  next.name += "-next";
  test::expect_continues(half.run_dir(), next, ref, 2);
}

TEST(Mtp, ResumesExactly) {
  const MtpMesh mesh = test_runtime().size() == 2 ? MtpMesh{2, 1} : MtpMesh{2, 2, 2, 1, true};
  expect_resumes_exactly(mtp("mtp-resume"), mesh);
}

// Under pp the checkpoint holds the embedding once (the first stage's) and
// restores both copies, with their moments: untied (the copy serves the
// modules alone) at pp 2, and with dp 2 and ZeRO-1 at np 4.
TEST(Mtp, ResumesExactlyUnderPipelineParallelism) {
  Config c = mtp("mtp-resume-pp");
  c.model.tie_embeddings = false;
  c.data.micro_batch_size = 2;
  MtpMesh mesh{test_runtime().size() == 2 ? 1 : 2, 1, 1, test_runtime().size() == 2 ? 0 : 1};
  mesh.pp = 2;
  expect_resumes_exactly(c, mesh);
}

// A run may add the modules to a model trained without them: they start from
// their initialisation (logged), and step 3's main loss, computed before any
// update touches them, is the loss of the run that never had them.
TEST(Mtp, StartsFromACheckpointWithoutModules) {
  Config plain = on(mtp("mtp-add"), {2, 1});
  plain.model.mtp_depth = 0;
  plain.training_steps = 4;
  if (test_runtime().size() != 2) plain = test::with_mesh(plain, 2, 1, 2);
  const auto ref = test::run_losses(plain, true);
  Config half = plain;
  half.name += "-half";
  half.training_steps = 2;
  half.checkpoint_steps = 2;
  test::run_losses(half, true);
  Config with_mtp = plain;
  with_mtp.name += "-mtp";
  with_mtp.model.mtp_depth = 2;
  auto world = test_runtime().world();
  if (world->rank() == 0) {
    std::filesystem::remove_all(with_mtp.run_dir());
    std::filesystem::copy(half.run_dir(), with_mtp.run_dir(), std::filesystem::copy_options::recursive);
  }
  world->barrier();
  const auto got = test::run_losses(with_mtp, false);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NEAR(got[0], ref[2], 1e-5) << "step 3's main loss";
  for (double l : got) EXPECT_TRUE(std::isfinite(l));
  if (world->rank() != 0) return;
  const auto rows = mtp_rows(with_mtp);
  ASSERT_EQ(rows.size(), 2u);  // steps 3 and 4 (the rows of steps 1-2 had none)
  for (const auto& r : rows) {
    ASSERT_EQ(r.size(), 2u);
    EXPECT_TRUE(std::isfinite(r[0]) && r[0] > 0 && std::isfinite(r[1]) && r[1] > 0);
  }
}
