// Context parallelism (device_config.context_parallel) and packed documents
// (data_config.document_masking): every mesh with cp 2 or 4, alone and with
// dp, tp (+ sequence parallelism), pp, ep, zero stages and recomputation,
// trains as one process does (losses and gradient norms), for dense MHA,
// GQA and MLA + MoE, with and without document masking; the cp group moves
// the bytes of the formula below, and MLA moves its latent, not its keys
// and values.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/data/shards.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/perf/plan.h"
#include "parity.h"

using namespace meshtrain;

namespace {

constexpr double kTol = 1e-5;
constexpr int64_t kEot = 0;
const std::string kData = test::scratch_dir("cp-data");

// Documents of 2..12 tokens, each ending with kEot, packed back to back: a
// row of 16 holds two or three documents (and the pieces of two more).
std::string document_data(int64_t vocab) {
  Runtime& rt = test_runtime();
  if (rt.rank() == 0 && !std::filesystem::exists(kData + "/val")) {
    std::filesystem::create_directories(kData + "/train");
    std::filesystem::create_directories(kData + "/val");
    auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
    auto stream = [&](int64_t n) {
      std::vector<int32_t> out;
      int64_t x = 1;
      while (static_cast<int64_t>(out.size()) < n) {
        const int64_t len = 2 + at::randint(11, {1}, gen, at::kLong).item<int64_t>();
        for (int64_t i = 0; i + 1 < len; ++i) {
          x = (x * 5 + at::randint(3, {1}, gen, at::kLong).item<int64_t>()) % (vocab - 1);
          out.push_back(static_cast<int32_t>(1 + x));  // 1..vocab-1: never the eot
        }
        out.push_back(static_cast<int32_t>(kEot));
      }
      out.resize(static_cast<size_t>(n));
      return out;
    };
    write_shard(kData + "/train/train_000000.bin", stream(40000));
    write_shard(kData + "/val/val_000000.bin", stream(10000));
  }
  rt.world()->barrier();
  return kData;
}

enum class Model { Mha, Gqa, MlaMoe };

Config model(Model m, bool documents, const std::string& name) {
  Config c = test::tiny_config(document_data(96), name);
  if (m == Model::Gqa) c = test::llama(c);
  if (m == Model::MlaMoe) c = test::moe_mla(c);
  c.data.document_masking = documents;
  c.data.eot_token = kEot;
  c.training_steps = 4;
  return c;
}

struct Mesh4 {
  std::string name;
  int dp = 1, pp = 1, tp = 1, cp = 1;
  bool sp = false;
  int ep = 1, zero = 0;
  std::string recompute = "none";
};

Config on(Config c, const Mesh4& k) {
  c = test::with_mesh(c, k.dp, k.pp, k.tp);
  c.device.context_parallel = k.cp;
  c.device.expert_parallel = k.ep;
  c.sequence_parallel = k.sp;
  c.zero_stage = k.zero;
  c.activation_checkpointing = parse_choice<ActivationCheckpointing>(k.recompute).value();
  if (k.pp > 1) c.data.micro_batch_size = 2;
  c.name += "-" + k.name;
  return c;
}

// The meshes of each -np (world = dp * pp * tp * cp). ep and pp cases run
// MoE or dense models as they apply.
std::vector<Mesh4> meshes(int n) {
  if (n == 2) return {{"cp2", 1, 1, 1, 2}, {"cp2-zero1-full", 1, 1, 1, 2, false, 1, 1, "full"}};
  if (n == 4)
    return {{"cp4", 1, 1, 1, 4},
            {"cp2-dp2-zero3", 2, 1, 1, 2, false, 1, 3},
            {"cp2-tp2-sp", 1, 1, 2, 2, true},
            {"cp2-pp2-selective", 1, 2, 1, 2, false, 1, 0, "selective"},
            {"cp2-dp2-ep2", 2, 1, 1, 2, false, 2}};
  if (n == 8)
    return {{"cp4-dp2", 2, 1, 1, 4}, {"cp2-dp2-tp2-zero2", 2, 1, 2, 2, false, 1, 2}, {"cp2-pp2-tp2", 1, 2, 2, 2}};
  return {};
}

void expect_every_mesh_matches_one_process(Model m, bool documents, const std::string& name) {
  const int n = test_runtime().size();
  if (meshes(n).empty()) GTEST_SKIP() << "no cp mesh for -np " << n;
  const Config base = model(m, documents, name);
  const test::Curve ref = test::single_process_losses(base);
  for (const Mesh4& k : meshes(n)) {
    if (k.ep > 1 && m != Model::MlaMoe) continue;
    SCOPED_TRACE(name + " on " + k.name);
    test::expect_same_curve(ref, test::train_losses(on(base, k)), kTol, name + " on " + k.name);
  }
}

TEST(ContextParallel, DenseMhaMatchesOneProcess) { expect_every_mesh_matches_one_process(Model::Mha, false, "mha"); }
TEST(ContextParallel, DenseMhaWithDocumentsMatchesOneProcess) {
  expect_every_mesh_matches_one_process(Model::Mha, true, "mha-docs");
}
TEST(ContextParallel, GqaWithDocumentsMatchesOneProcess) {
  expect_every_mesh_matches_one_process(Model::Gqa, true, "gqa-docs");
}
TEST(ContextParallel, MlaMoeMatchesOneProcess) { expect_every_mesh_matches_one_process(Model::MlaMoe, false, "mla-moe"); }
TEST(ContextParallel, MlaMoeWithDocumentsMatchesOneProcess) {
  expect_every_mesh_matches_one_process(Model::MlaMoe, true, "mla-moe-docs");
}

// Document masking changes the training (attention stops at document ends):
// the same data without it gives other losses, so the cases above compare
// runs that really mask.
TEST(ContextParallel, DocumentMaskingChangesTheLosses) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "-np 2 only";
  const test::Curve masked = test::single_process_losses(model(Model::Mha, true, "masked"));
  const test::Curve plain = test::single_process_losses(model(Model::Mha, false, "plain"));
  EXPECT_GT(std::abs(masked[0] - plain[0]), 1e-4);
}

// The cp group's bytes per step (comm.h counts an all-gather by its output
// and a reduce-scatter by its input, so each gather moves the whole
// sequence's tensor both ways): per layer, microbatch and direction,
//   MHA: B * T * 2 * (n_kv_head / tp) * head_dim * 4       (k and v, fp32)
//   MLA: B * T * (latent_dim + dhR) * 4                     (latent and rope key;
//        dhR 0 in a block's last layer under mla_last_layer_no_rope)
//   MoE layer: + B * T * n_experts * 4                      (router logits)
// with B this rank's sequences per step. MLA's exchange is the latent's: for
// this model 20 numbers per token against 2 * n_head * head_dim = 64 for its
// keys and values.
TEST(ContextParallel, ExchangeBytesEqualTheFormula) {
  if (test_runtime().size() != 2) GTEST_SKIP() << "-np 2 only";
  for (Model m : {Model::Mha, Model::Gqa, Model::MlaMoe}) {
    Config c = on(model(m, false, "bytes"), {"cp2", 1, 1, 1, 2});
    c.eval_steps = 0;
    c.training_steps = 2;
    c.name += std::to_string(static_cast<int>(m));
    SessionOptions o;
    o.fresh = true;
    o.quiet = true;
    Trainer t(c, test_runtime(), o);
    t.train();
    const ModelConfig& mc = c.model;
    const double B = static_cast<double>(c.data.train_batch_size), T = static_cast<double>(c.data.T);
    double per_step = 0;
    for (int64_t i = 0; i < mc.n_layers(); ++i) {
      const double width = mc.attention == AttentionKind::Mla
                               ? static_cast<double>(mc.latent_dim + mla_layer_dhR(mc, i))
                               : 2.0 * static_cast<double>(mc.kv_heads() * mc.head_dim());
      per_step += 2 * B * T * width * 4;
      if (mc.ffn == FfnKind::Moe) per_step += 2 * B * T * static_cast<double>(mc.n_experts) * 4;
    }
    EXPECT_EQ(static_cast<double>(t.mesh().cp().bytes_moved()), per_step * static_cast<double>(c.training_steps))
        << "model " << static_cast<int>(m);
    std::vector<int64_t> layers;
    for (int64_t i = 0; i < mc.n_layers(); ++i) layers.push_back(i);
    EXPECT_EQ(cp_exchange_bytes(c, layers), per_step) << "plan's formula, model " << static_cast<int>(m);
    if (test_runtime().rank() == 0)
      std::printf("cp 2, %s: %.0f bytes per step and rank\n",
                  m == Model::MlaMoe ? "MLA + MoE (latent + rope key + router logits)"
                                     : (m == Model::Gqa ? "GQA (k, v of 2 kv heads)" : "MHA (k, v)"),
                  per_step);
  }
}

}  // namespace
