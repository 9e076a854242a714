// Multi-token prediction (model/mtp.h): the shifted targets and their masks,
// the config's refusals, the Hugging Face mapping of the MTP layers, and the
// losses and gradients of a tiny MLA + MoE model against an independent
// PyTorch reference written from DeepSeek-V3's equations
// (tests/tools/mtp_reference.py, stock transformers' decoder layers).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/config/load.h"
#include "meshtrain/hf/hf_model.h"
#include "meshtrain/model/mtp.h"
#include "meshtrain/model/transformer.h"
#include "tiny_model.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

at::Tensor ids(std::vector<int64_t> v) { return at::tensor(v, at::kLong).unsqueeze(0); }

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).reshape({-1}).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

std::vector<int64_t> longs(const at::Tensor& t) {
  const at::Tensor c = t.reshape({-1}).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Sequence t_0..t_6 = 5 7 2 9 4 8 3 with end-of-text 2: documents [5 7 2] [9 4 8 3].
TEST(MtpTargets, ShiftByDepthAndMaskAtDocumentEnds) {
  const MtpTargets t = mtp_targets(ids({5, 7, 2, 9, 4, 8}), ids({7, 2, 9, 4, 8, 3}), 2, /*eot=*/2);
  ASSERT_EQ(t.tokens.size(), 2u);
  EXPECT_EQ(longs(t.tokens[0]), (std::vector<int64_t>{7, 2, 9, 4, 8, 3}));   // t_{i+1}
  EXPECT_EQ(longs(t.targets[0]), (std::vector<int64_t>{2, 9, 4, 8, 3, 0}));  // t_{i+2}
  // Position 1 (7) would predict 9, position 2 (the eot) 4: both across the document's end.
  EXPECT_EQ(values(t.mask[0]), (std::vector<float>{1, 0, 0, 1, 1, 0}));
  EXPECT_EQ(longs(t.tokens[1]), (std::vector<int64_t>{2, 9, 4, 8, 3, 0}));
  EXPECT_EQ(longs(t.targets[1]), (std::vector<int64_t>{9, 4, 8, 3, 0, 0}));
  EXPECT_EQ(values(t.mask[1]), (std::vector<float>{0, 0, 0, 1, 0, 0}));
  // One document per row: only the sequence's end masks.
  const MtpTargets plain = mtp_targets(ids({5, 7, 2, 9, 4, 8}), ids({7, 2, 9, 4, 8, 3}), 2, -1);
  EXPECT_EQ(values(plain.mask[0]), (std::vector<float>{1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(values(plain.mask[1]), (std::vector<float>{1, 1, 1, 1, 0, 0}));
}

std::string refusal(const std::vector<std::string>& sets) {
  const fs::path dir = fs::temp_directory_path() / ("mtp_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "c.json").string();
  std::ofstream(path) << to_json(Config{}).dump();
  try {
    load_config(path, sets);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(MtpConfig, BadValuesAreRefusedNamingTheKey) {
  EXPECT_NE(refusal({"model_config.mtp_depth=-1"}).find("model_config.mtp_depth"), std::string::npos);
  EXPECT_NE(refusal({"model_config.mtp_loss_weight=-0.1"}).find("model_config.mtp_loss_weight"), std::string::npos);
  EXPECT_NE(refusal({"model_config.mtp_loss_weight=10.5"}).find("model_config.mtp_loss_weight"), std::string::npos);
  // Pipeline parallelism takes MTP (the last stage's embedding copy: dist.mtp_parity_test).
  EXPECT_EQ(refusal({"model_config.mtp_depth=1", "device_config.n_device_axis=[1,2,1]"}), "");
  EXPECT_EQ(refusal({"model_config.mtp_depth=2", "model_config.mtp_loss_weight=10"}), "");
  EXPECT_EQ(refusal({"model_config.mtp_depth=0", "model_config.mtp_loss_weight=0"}), "");
  // Speculative decoding drafts with the modules (greedy or sampled:
  // unit.speculative_test).
  const std::string no_mtp = refusal({"inference_config.speculative=true", "inference_config.temperature=0"});
  EXPECT_NE(no_mtp.find("inference_config.speculative"), std::string::npos) << no_mtp;
  EXPECT_NE(no_mtp.find("model_config.mtp_depth"), std::string::npos) << no_mtp;
  EXPECT_EQ(refusal({"inference_config.speculative=true", "model_config.mtp_depth=1"}), "");
  const std::string pp = refusal({"inference_config.speculative=true", "model_config.mtp_depth=1",
                                  "device_config.n_device_axis=[1,2,1]"});
  EXPECT_NE(pp.find("inference_config.speculative"), std::string::npos) << pp;
  EXPECT_NE(pp.find("device_config.n_device_axis[1]"), std::string::npos) << pp;
}

// DeepSeek-V3's options (hf_model.h), tiny; every layer with rope, so the
// mapping is a pure rearrangement (gradients map as the weights do).
ModelConfig v3(int64_t depth) {
  ModelConfig m = test::tiny_v3_model();
  m.vocab_size = 64;
  m.T = 12;
  m.tie_embeddings = false;
  m.capacity_factor = 0;  // dropless, as Hugging Face's MoE
  m.init_std = 0.1;
  m.mtp_depth = depth;
  m.mtp_loss_weight = 0.3;
  return m;
}

TensorSource from(const std::map<std::string, at::Tensor>& t) {
  return [&t](const std::string& name) {
    const auto it = t.find(name);
    if (it == t.end()) throw std::runtime_error("no tensor " + name);
    return it->second;
  };
}

TEST(MtpHf, LayersMapToDeepSeekV3NamesAndBack) {
  const ModelConfig m = v3(2);
  LayerFactory plain;
  Transformer model(m, plain);
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = at::randn(p.value().sizes());
  const NamedTensors hf = to_hf_tensors(m, from(params));
  std::map<std::string, at::Tensor> by_name(hf.begin(), hf.end());
  for (const char* n : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                        "shared_head.head.weight", "embed_tokens.weight", "self_attn.q_a_proj.weight",
                        "mlp.experts.3.down_proj.weight"})
    for (int64_t layer : {2, 3}) EXPECT_TRUE(by_name.count("model.layers." + std::to_string(layer) + "." + n)) << n;
  EXPECT_EQ(by_name.at("model.layers.2.eh_proj.weight").sizes(), at::IntArrayRef({32, 64}));
  const auto back = from_hf_tensors(m, from(by_name));
  ASSERT_EQ(back.size(), params.size());
  for (const auto& [name, t] : params) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_TRUE(at::equal(back.at(name), t)) << name;
  }
  const nlohmann::json cfg = hf_config_json(m, 0);
  EXPECT_EQ(cfg.at("num_nextn_predict_layers"), 2);
  EXPECT_EQ(model_config_from_hf(cfg, m).mtp_depth, 2);
  EXPECT_EQ(count_params(m).total, count_built_params(model).total);
}

std::string run(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe.get())) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe.release());
  if (status != 0) throw std::runtime_error("command failed (status " + std::to_string(status) + "): " + cmd + "\n" + out);
  return out;
}

// meshtrain's losses and gradients for a batch with document ends, written
// with the weights (Hugging Face names) for the reference to recompute.
void dump_meshtrain(const ModelConfig& m, const std::string& path) {
  LayerFactory plain;
  plain.set_seed(7);
  Transformer model(m, plain);
  model.train();
  const int64_t B = 2, T = m.T, eot = 1;
  at::manual_seed(3);
  at::Tensor seq = at::randint(2, m.vocab_size, {B, T + 1}, at::kLong);
  seq.index_put_({0, 4}, eot);
  seq.index_put_({1, 7}, eot);
  const at::Tensor inputs = seq.narrow(1, 0, T), targets = seq.narrow(1, 1, T);
  const MtpTargets t = mtp_targets(inputs, targets, m.mtp_depth, eot);
  const at::Tensor h = model.forward_layers(model.embed(inputs), nullptr);
  const at::Tensor main = model.token_losses(h, targets).mean();
  const std::vector<at::Tensor> mtp = model.mtp_token_losses(h, t, nullptr);
  // L = L_main + lambda / D * sum_k L^k, L^k = (1 / (B T)) * sum of depth k's token losses.
  at::Tensor loss = main;
  std::vector<std::pair<std::string, at::Tensor>> out = {{"inputs", inputs}, {"targets", targets},
                                                         {"loss_main", main.detach().reshape({1})}};
  for (size_t k = 0; k < mtp.size(); ++k) {
    const at::Tensor lk = mtp[k].sum() / static_cast<double>(B * T);
    loss = loss + lk * (m.mtp_loss_weight / static_cast<double>(m.mtp_depth));
    out.emplace_back("loss_mtp_" + std::to_string(k + 1), lk.detach().reshape({1}));
  }
  out.emplace_back("loss_total", loss.detach().reshape({1}));
  loss.backward();
  std::map<std::string, at::Tensor> weights, grads;
  for (const auto& p : model.named_parameters()) {
    weights[p.key()] = p.value().detach();
    grads[p.key()] = p.value().grad().defined() ? p.value().grad() : at::zeros_like(p.value());
  }
  for (const auto& [name, w] : to_hf_tensors(m, from(weights))) out.emplace_back("weight/" + name, w);
  for (const auto& [name, g] : to_hf_tensors(m, from(grads))) out.emplace_back("grad/" + name, g);
  write_safetensors(path, out, {{"config", hf_config_json(m, eot).dump()},
                                {"mtp_loss_weight", std::to_string(m.mtp_loss_weight)},
                                {"eot", std::to_string(eot)}});
}

class MtpReference : public ::testing::TestWithParam<int64_t> {};

TEST_P(MtpReference, LossesAndGradientsMatchPyTorchFromTheEquations) {
  const int64_t depth = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("mtp_ref_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string dump = (dir / ("d" + std::to_string(depth) + ".safetensors")).string();
  dump_meshtrain(v3(depth), dump);
  const std::string setup = run("bash " + std::string(MT_SOURCE_DIR) + "/scripts/dev/setup-pyenv.sh");
  const std::string python = setup.substr(setup.rfind('\n', setup.size() - 2) + 1);
  const std::string py = python.substr(0, python.find_last_not_of("\n") + 1);
  // The script exits non-zero (and run() throws with its report) when a loss
  // or gradient differs by more than 1e-5.
  const std::string report = run(py + " " + MT_SOURCE_DIR + "/tests/tools/mtp_reference.py " + dump + " 1e-5 2>&1");
  std::printf("%s", report.c_str());
  EXPECT_NE(report.find("max gradient difference"), std::string::npos) << report;
  fs::remove_all(dir);  // kept when the reference fails (run() throws first): the dump to look at
}

INSTANTIATE_TEST_SUITE_P(Depths, MtpReference, ::testing::Values(1, 2));

}  // namespace
}  // namespace meshtrain
