// Greedy self-speculative decoding with the MTP modules
// (sampling/speculative.h): token for token the output of plain greedy
// sampling, for an untrained model (drafts mostly rejected) and one trained on
// a cyclic sequence (drafts mostly accepted), past the context length T too;
// prints the acceptance rate and the time against plain greedy sampling.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

#include "meshtrain/model/mtp.h"
#include "meshtrain/sampling/generate.h"
#include "meshtrain/sampling/speculative.h"

namespace meshtrain {
namespace {

ModelConfig tiny(FfnKind ffn) {
  ModelConfig m;
  m.model_dimension = 32;
  m.n_head = 4;
  m.vocab_size = 48;
  m.T = 32;
  m.blocks = 1;
  m.layers_per_block = 2;
  m.ffn = ffn;
  m.n_experts = 4;
  m.k = 2;
  m.mlp_hidden = 32;
  m.capacity_factor = 0;  // dropless: a longer forward drops nothing else (speculative.h)
  m.mtp_depth = 2;
  return m;
}

// Rows of a cycle of 11 tokens from random starts: predictable several tokens ahead.
at::Tensor cyclic(int64_t B, int64_t T) {
  const at::Tensor start = at::randint(0, 11, {B, 1}, at::kLong);
  return (start + at::arange(T + 1, at::kLong).unsqueeze(0)) % 11 * 3 + 1;
}

void train(Transformer& model, int64_t steps) {
  const ModelConfig& m = model.config();
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(3e-3));
  model.train();
  for (int64_t s = 0; s < steps; ++s) {
    const at::Tensor seq = cyclic(8, m.T);
    const at::Tensor in = seq.narrow(1, 0, m.T), tg = seq.narrow(1, 1, m.T);
    const at::Tensor h = model.forward_layers(model.embed(in), nullptr);
    at::Tensor loss = model.token_losses(h, tg).mean();
    for (const at::Tensor& l : model.mtp_token_losses(h, mtp_targets(in, tg, m.mtp_depth, -1), nullptr))
      loss = loss + l.sum() / static_cast<double>(in.numel()) * (0.3 / static_cast<double>(m.mtp_depth));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void expect_same_as_greedy(Transformer& model, const char* what, double min_acceptance) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 4, 7}, {10, 13}, {31, 1, 4, 7, 10}};
  SampleOptions o;
  o.temperature = 0;
  o.max_tokens = 40;  // past T = 32: the last steps run without drafts
  o.use_cache = false;
  std::vector<std::vector<int32_t>> plain, cached, spec;
  SpeculativeStats st;
  const double t_plain = seconds_of([&] { plain = generate(model, prompts, o); });
  o.use_cache = true;
  const double t_cached = seconds_of([&] { cached = generate(model, prompts, o); });
  const double t_spec = seconds_of([&] { spec = generate_speculative(model, prompts, o, &st); });
  ASSERT_EQ(spec.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(spec[i], plain[i]) << what << ", prompt " << i;
  EXPECT_GE(st.acceptance(), min_acceptance) << what;
  size_t tokens = 0;
  for (const auto& s : spec) tokens += s.size();
  std::printf("%s: %zu tokens, acceptance %.3f (%lld of %lld drafts), %lld main forwards; tokens/s: speculative "
              "%.0f, plain greedy without cache %.0f, with cache %.0f\n",
              what, tokens, st.acceptance(), static_cast<long long>(st.accepted), static_cast<long long>(st.drafted),
              static_cast<long long>(st.forwards), static_cast<double>(tokens) / t_spec,
              static_cast<double>(tokens) / t_plain, static_cast<double>(tokens) / t_cached);
}

class Speculative : public ::testing::TestWithParam<FfnKind> {};

TEST_P(Speculative, GreedyOutputIsPlainGreedysTokenForToken) {
  at::manual_seed(11);
  LayerFactory f;
  f.set_seed(5);
  Transformer model(tiny(GetParam()), f);
  const char* kind = GetParam() == FfnKind::Moe ? "moe" : "dense";
  expect_same_as_greedy(model, (std::string(kind) + " untrained").c_str(), 0.0);
  train(model, 150);
  // The cyclic sequence is learnt: most drafts are right.
  expect_same_as_greedy(model, (std::string(kind) + " trained").c_str(), 0.5);
}

INSTANTIATE_TEST_SUITE_P(Ffn, Speculative, ::testing::Values(FfnKind::Dense, FfnKind::Moe));

TEST(SpeculativeRefusals, NeedsMtpAndGreedy) {
  LayerFactory f;
  ModelConfig m = tiny(FfnKind::Dense);
  SampleOptions o;
  o.temperature = 0;
  m.mtp_depth = 0;
  Transformer plain(m, f);
  EXPECT_THROW(generate_speculative(plain, {{1}}, o, nullptr), Error);
  LayerFactory g;
  Transformer with(tiny(FfnKind::Dense), g);
  o.temperature = 1.0;
  try {
    generate_speculative(with, {{1}}, o, nullptr);
    ADD_FAILURE() << "temperature 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inference_config.temperature"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
