#pragma once
// Parity helpers for the multi-rank tests: tiny synthetic data written by rank
// 0, a tiny config, and "train N steps on this mesh, return the losses" through
// the real Trainer (loader, pipeline, gradient sync, AdamW), so every mesh can
// be compared with one process.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "dist_env.h"
#include "meshtrain/config/config.h"
#include "meshtrain/config/load.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::test {

// A scratch directory for this test run: ctest gives every (test, np) its own
// MESHTRAIN_TEST_TMP inside the build tree, so concurrent runs and clones never
// share data or run directories; run by hand, a per-user /tmp directory.
inline std::string scratch_dir(const std::string& name) {
  const char* root = std::getenv("MESHTRAIN_TEST_TMP");
  if (root != nullptr && *root != '\0') return std::string(root) + "/" + name;
  const char* user = std::getenv("USER");
  return (std::filesystem::temp_directory_path() / ("meshtrain-test-" + std::string(user ? user : "user")) / name)
      .string();
}

// Random tokens (fixed seed) in data_dir/train and data_dir/val; rank 0 writes,
// everyone waits. Same data on every run, so losses are comparable across runs.
inline std::string synthetic_data(const std::string& data_dir, int64_t vocab, int64_t tokens = 40000) {
  Runtime& rt = test_runtime();
  if (rt.rank() == 0 && !std::filesystem::exists(data_dir + "/val")) {
    std::filesystem::create_directories(data_dir + "/train");
    std::filesystem::create_directories(data_dir + "/val");
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
    // A learnable stream: token t+1 = (a * token t + noise) mod vocab, so loss falls.
    std::vector<int32_t> tr(static_cast<size_t>(tokens)), va(static_cast<size_t>(tokens / 4));
    at::Tensor noise = at::randint(0, 3, {tokens}, gen, at::kLong);
    int64_t x = 1;
    for (int64_t i = 0; i < tokens; ++i) {
      x = (x * 5 + noise[i].item<int64_t>()) % vocab;
      tr[static_cast<size_t>(i)] = static_cast<int32_t>(x);
      if (i < tokens / 4) va[static_cast<size_t>(i)] = static_cast<int32_t>((x * 7) % vocab);
    }
    write_shard(data_dir + "/train/train_000000.bin", tr);
    write_shard(data_dir + "/val/val_000000.bin", va);
  }
  rt.world()->barrier();
  return data_dir;
}

// A tiny dense model; tests switch on what they need with the fields.
inline Config tiny_config(const std::string& data_dir, const std::string& run_name) {
  Config c;
  // CPU parity, also on GPU machines (where "auto" would put every rank on
  // one GPU); the CUDA tests set their device themselves.
  c.device.device = DeviceChoice::Cpu;
  c.model.model_dimension = 32;
  c.model.n_head = 4;
  c.model.blocks = 2;
  c.model.layers_per_block = 2;
  c.model.T = 16;
  c.model.vocab_size = 96;
  c.model.dropout_rate = 0.0;
  c.data.T = 16;
  c.data.data_dir = data_dir;
  c.data.train_batch_size = 8;
  c.data.val_batch_size = 8;
  c.data.micro_batch_size = 0;
  c.lr.max_lr = 3e-3;
  c.lr.warmup_steps = 2;
  c.lr.end_steps = 20;
  c.training_steps = 5;
  c.checkpoint_steps = 1000;
  c.eval_steps = 1;
  c.output_dir = data_dir + "/runs";
  c.name = run_name;
  c.inference.max_tokens = 0;
  return c;
}

// The tiny Jaxformer model: MLA attention and MoE feed-forward.
inline Config moe_mla(Config c) {
  c.model.attention = AttentionKind::Mla;
  c.model.latent_dim = 16;
  c.model.dhR = 4;
  c.model.ffn = FfnKind::Moe;
  c.model.n_experts = 4;
  c.model.k = 2;
  c.model.n_shared = 1;
  c.model.capacity_factor = 1.25;
  c.model.mlp_hidden = 32;
  c.alpha = 0.01;
  return c;
}

// The tiny model of Jaxformer's architecture: configs/tiny-jaxformer.json's
// model (Jaxformer's layout, so the jaxformer preset: MLA with biases and
// rope projections from the joint latent, MoE in each block's last layer,
// sigmoid router, biased RMSNorms) at the test's T and vocabulary. The shared
// expert is the corrected "linear" variant unless `shared_expert` says
// otherwise: Jaxformer's code drops its output (linear_discarded).
inline Config jaxformer(Config c, SharedExpert shared_expert = SharedExpert::Linear) {
  ModelConfig m = load_config(std::string(MT_SOURCE_DIR) + "/configs/tiny-jaxformer.json").config.model;
  EXPECT_EQ(m.architecture, Architecture::Jaxformer)
      << "configs/tiny-jaxformer.json should load as the Jaxformer model";
  m.T = c.model.T;
  m.vocab_size = c.model.vocab_size;
  m.dropout_rate = 0.0;
  m.shared_expert = shared_expert;
  c.model = m;
  c.alpha = 0.01;
  return c;
}

// Llama's options on the dense model: SwiGLU MLP and grouped-query attention
// (2 kv heads for 4 heads: split over tp 2, replicated over tp 4).
inline Config llama(Config c) {
  c.model.mlp_activation = MlpActivation::Swiglu;
  c.model.n_kv_head = 2;
  return c;
}

// DeepSeek-V3's options on the MoE + MLA model: SwiGLU experts, latent norms,
// sigmoid router with a score bias moved by its balancing rule, scaled gates,
// group-limited top-k, and a dense first layer.
inline Config deepseek_v3(Config c) {
  c = moe_mla(c);
  c.model.mlp_activation = MlpActivation::Swiglu;
  c.model.mla_latent_norm = true;
  c.model.router_score = RouterScore::Sigmoid;
  c.model.router_bias = true;
  c.model.router_bias_update_rate = 0.01;  // moves the bias from step 1 on, so it steers the choice
  c.model.routed_scaling_factor = 2.5;
  c.model.n_group = 2;
  c.model.topk_group = 1;
  c.model.first_k_dense = 1;
  c.model.dense_mlp_hidden = 48;
  return c;
}

inline Config with_mesh(Config c, int dp, int pp, int tp) {
  c.device.n_device_axis = {dp, pp, tp};
  return c;
}

// A training run's per-step mean losses (the vector itself) and global
// gradient norms. Comparing norms as well as losses matters: Adam's update is
// almost invariant to the gradient's scale, so a wrongly scaled gradient can
// leave the losses of a few steps unchanged.
struct Curve : std::vector<double> {
  std::vector<double> grad_norms;
};

inline Curve curve_of(const Trainer& t) {
  Curve c;
  c.assign(t.losses().begin(), t.losses().end());
  c.grad_norms = t.grad_norms();
  return c;
}

// Expects the same losses and gradient norms within tol (relative for norms).
inline void expect_same_curve(const Curve& ref, const Curve& got, double tol, const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  ASSERT_EQ(ref.grad_norms.size(), got.grad_norms.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(ref[i], got[i], tol) << what << ": loss of step " << i;
    EXPECT_NEAR(ref.grad_norms[i], got.grad_norms[i], tol * std::max(1.0, ref.grad_norms[i]))
        << what << ": grad norm of step " << i;
  }
}

// Trains cfg.training_steps steps from scratch; the same on every rank.
// backward_thread: every backward pass on a thread of its own, as CUDA's
// autograd engine runs it (SessionOptions::backward_thread).
inline Curve train_losses(const Config& cfg, bool backward_thread = false) {
  SessionOptions o;
  o.fresh = true;
  o.quiet = true;
  o.backward_thread = backward_thread;
  Trainer t(cfg, test_runtime(), o);
  t.train();
  return curve_of(t);
}

// The reference: cfg on a 1x1x1 mesh, trained inside every rank on its own
// (a sub-world of one rank), so a multi-rank test can compare any mesh with it.
inline Curve single_process_losses(Config cfg, bool backward_thread = false) {
  cfg.device.n_device_axis = {1, 1, 1};
  cfg.device.expert_parallel = 1;
  cfg.name += "-ref-rank" + std::to_string(test_runtime().rank());
  auto world = test_runtime().world();
  auto self = split_communicator(*world, world->rank(), 0);
  SessionOptions o;
  o.fresh = true;
  o.quiet = true;
  o.backward_thread = backward_thread;
  Trainer t(cfg, test_runtime(), o, self.get());
  t.train();
  return curve_of(t);
}

// Trains cfg on this mesh, from scratch (fresh) or from the newest
// checkpoint in its run directory; the losses of the steps it ran.
inline std::vector<double> run_losses(const Config& cfg, bool fresh) {
  SessionOptions o;
  o.fresh = fresh;
  o.quiet = true;
  Trainer t(cfg, test_runtime(), o);
  t.train();
  return t.losses();
}

// `next` continues from the checkpoints `saved` holds: rank 0 copies that
// run directory to next's, everyone waits, and next trains on. Its losses
// must be the reference's from where `saved` stopped (within 1e-5).
inline void expect_continues(const std::string& saved, const Config& next, const std::vector<double>& ref,
                             size_t from) {
  auto world = test_runtime().world();
  if (world->rank() == 0) {
    std::filesystem::remove_all(next.run_dir());
    std::filesystem::copy(saved, next.run_dir(), std::filesystem::copy_options::recursive);
  }
  world->barrier();
  const auto cont = run_losses(next, false);
  ASSERT_EQ(cont.size(), ref.size() - from) << next.name;
  for (size_t i = 0; i < cont.size(); ++i)
    EXPECT_NEAR(cont[i], ref[from + i], 1e-5) << next.name << " step " << from + i + 1;
}

}  // namespace meshtrain::test
