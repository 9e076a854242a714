// Multi-token prediction (model_config.mtp_depth, model/mtp.h) on every mesh
// it runs on (pp 1): dp, tp with and without sequence parallelism, context
// parallelism (the shifted tokens cut before the chunks), ZeRO-1, FSDP
// (zero_stage 3), expert parallelism and activation recomputation give one
// process's losses, gradient norms and per-depth MTP losses (metrics.jsonl's
// mtp_loss), for the DeepSeek-V3-style MLA + MoE model with D = 2 and packed
// documents: fp32 within 2e-5, bf16 within 2 bf16 roundings (bf16_test.cpp's
// kMesh) of one bf16 process. Runs under mpirun -np 2 and 4.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

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
  int cp = 1;
  std::string str() const {
    return "dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " cp" + std::to_string(cp) + " ep" +
           std::to_string(ep) + " zero" + std::to_string(zero) + (sp ? " sp" : "") + (recompute ? " recompute" : "");
  }
};

Config on(Config c, const MtpMesh& m) {
  c = test::with_mesh(c, m.dp, 1, m.tp);
  c.device.expert_parallel = m.ep;
  c.device.context_parallel = m.cp;
  c.zero_stage = m.zero;
  c.sequence_parallel = m.sp;
  c.activation_checkpointing = m.recompute ? ActivationCheckpointing::Full : ActivationCheckpointing::None;
  c.name += "-" + std::to_string(m.dp) + std::to_string(m.tp) + std::to_string(m.cp) + std::to_string(m.ep) +
            std::to_string(m.zero) +
            (m.sp ? "s" : "") + (m.recompute ? "r" : "");
  return c;
}

std::vector<MtpMesh> meshes(int n) {
  if (n == 2)
    return {{2, 1}, {1, 2}, {1, 2, 1, 0, true}, {2, 1, 2, 1}, {2, 1, 1, 3, false, true}, {1, 1, 1, 0, false, false, 2}};
  if (n == 4) return {{2, 2, 2, 1, true, true}, {4, 1, 4, 3}, {1, 2, 2, 0, true, false, 2}, {2, 1, 4, 1, false, true, 2}};
  return {};
}

// The per-depth MTP losses of every training row of a run's metrics.jsonl.
std::vector<std::vector<double>> mtp_rows(const Config& c) {
  std::ifstream in(c.run_dir() + "/metrics.jsonl");
  std::vector<std::vector<double>> rows;
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("mtp_loss")) rows.push_back(row["mtp_loss"].get<std::vector<double>>());
  }
  return rows;
}

void expect_meshes_match(const Config& base, double tol, bool relative) {
  const auto ref = test::single_process_losses(base);
  Config ref_cfg = base;
  ref_cfg.name += "-ref-rank" + std::to_string(test_runtime().rank());
  const auto ref_mtp = mtp_rows(ref_cfg);
  ASSERT_EQ(ref_mtp.size(), static_cast<size_t>(base.training_steps));
  ASSERT_EQ(ref_mtp[0].size(), 2u);
  for (const MtpMesh& m : meshes(test_runtime().size())) {
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
    const auto rows = mtp_rows(c);
    ASSERT_EQ(rows.size(), ref_mtp.size());
    for (size_t s = 0; s < rows.size(); ++s)
      for (size_t k = 0; k < 2; ++k)
        EXPECT_NEAR(rows[s][k], ref_mtp[s][k], relative ? tol * std::abs(ref_mtp[s][k]) : tol)
            << "step " << s + 1 << " depth " << k + 1;
  }
}

}  // namespace

TEST(Mtp, EveryMeshMatchesOneProcess) { expect_meshes_match(mtp("mtp"), 2e-5, false); }

// bf16 mixed precision: within two bf16 roundings of one bf16 process (relative).
TEST(Mtp, Bf16MeshesMatchOneBf16Process) {
  Config c = mtp("mtp-bf16");
  c.model.model_dtype = ModelDtype::Bfloat16;
  expect_meshes_match(c, 2.0 / 256, true);
}
