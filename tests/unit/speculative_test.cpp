// Self-speculative decoding with the MTP modules (sampling/speculative.h).
// Greedy: token for token the output of plain greedy sampling, with the KV
// cache as with it and without as without, for untrained models (drafts
// mostly rejected) and ones trained on a cyclic sequence (drafts mostly
// accepted), dense, MoE and MLA + MoE, past the context length T (cache
// restarts) too, also on a model whose cached and uncached outputs differ
// there; prints the acceptance and tokens/s against plain sampling, also for
// a deeper model (8 layers, D = 1 and 2). Temperature 1: the first new tokens
// of many samples follow the model's own distribution (chi-square against the
// exact one from its logits), and within T the MTP modules on their caches
// draft as over the whole window. And the caches' truncation (the main
// model's, an MTP module's in pieces), and the refusals.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "chi_square.h"
#include "meshtrain/model/mtp.h"
#include "meshtrain/sampling/generate.h"
#include "meshtrain/sampling/speculative.h"

namespace meshtrain {
namespace {

ModelConfig tiny(FfnKind ffn, AttentionKind attention = AttentionKind::Mha) {
  ModelConfig m;
  m.model_dimension = 32;
  m.n_head = 4;
  m.vocab_size = 48;
  m.T = 32;
  m.blocks = 1;
  m.layers_per_block = 2;
  m.ffn = ffn;
  m.attention = attention;
  m.latent_dim = 16;
  m.dhR = 4;
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

// The fastest of three runs of f, in seconds (the machine is shared).
double seconds_of(const std::function<void()>& f) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// max_tokens 56: past T = 32 the cached paths restart twice, the uncached
// ones stop drafting; within T = 64 neither.
void expect_same_as_greedy(Transformer& model, const std::string& what, double min_acceptance) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 4, 7}, {10, 13}, {31, 1, 4, 7, 10}};
  SampleOptions o;
  o.temperature = 0;
  o.max_tokens = 56;
  std::vector<std::vector<int32_t>> plain, cached, spec, spec_cached;
  SpeculativeStats st, st_cached;
  o.use_cache = false;
  const double t_plain = seconds_of([&] { plain = generate(model, prompts, o); });
  const double t_spec = seconds_of([&] { spec = generate_speculative(model, prompts, o, &st); });
  o.use_cache = true;
  const double t_cached = seconds_of([&] { cached = generate(model, prompts, o); });
  const double t_spec_cached = seconds_of([&] { spec_cached = generate_speculative(model, prompts, o, &st_cached); });
  ASSERT_EQ(spec.size(), plain.size());
  ASSERT_EQ(spec_cached.size(), cached.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(spec[i], plain[i]) << what << " without the cache, prompt " << i;
    EXPECT_EQ(spec_cached[i], cached[i]) << what << " with the cache, prompt " << i;
  }
  EXPECT_GE(st.acceptance(), min_acceptance) << what;
  EXPECT_GE(st_cached.acceptance(), min_acceptance) << what;
  size_t tokens = 0;
  for (const auto& s : spec_cached) tokens += s.size();
  const auto rate = [&](double t) { return static_cast<double>(tokens) / t; };
  std::printf("%s: %zu tokens; with the cache acceptance %.3f (%lld of %lld drafts), %lld main forwards; without "
              "%.3f (%lld of %lld), %lld forwards; tokens/s (best of 3, %d thread): speculative with cache %.0f, "
              "plain with cache %.0f, speculative without cache %.0f, plain without cache %.0f\n",
              what.c_str(), tokens, st_cached.acceptance(), static_cast<long long>(st_cached.accepted),
              static_cast<long long>(st_cached.drafted), static_cast<long long>(st_cached.forwards), st.acceptance(),
              static_cast<long long>(st.accepted), static_cast<long long>(st.drafted),
              static_cast<long long>(st.forwards), at::get_num_threads(), rate(t_spec_cached), rate(t_cached),
              rate(t_spec), rate(t_plain));
}

struct Kind {
  FfnKind ffn;
  AttentionKind attention;
  const char* name;
};

void PrintTo(const Kind& k, std::ostream* os) { *os << k.name; }

class Speculative : public ::testing::TestWithParam<Kind> {};

TEST_P(Speculative, GreedyOutputIsPlainGreedysTokenForToken) {
  at::set_num_threads(1);
  at::manual_seed(11);
  LayerFactory f;
  f.set_seed(5);
  Transformer model(tiny(GetParam().ffn, GetParam().attention), f);
  expect_same_as_greedy(model, std::string(GetParam().name) + " untrained", 0.0);
  train(model, 150);
  // The cyclic sequence is learnt: most drafts are right.
  expect_same_as_greedy(model, std::string(GetParam().name) + " trained", 0.5);
}

INSTANTIATE_TEST_SUITE_P(Models, Speculative,
                         ::testing::Values(Kind{FfnKind::Dense, AttentionKind::Mha, "dense"},
                                           Kind{FfnKind::Moe, AttentionKind::Mha, "moe"},
                                           Kind{FfnKind::Moe, AttentionKind::Mla, "mla+moe"}),
                         [](const auto& info) { return std::string(info.param.ffn == FfnKind::Dense ? "Dense" : "Moe") +
                                                       (info.param.attention == AttentionKind::Mla ? "Mla" : "Mha"); });

// DeepSeek-V3's case: a deep main model and one-layer MTP modules, trained
// until most drafts are kept (8 layers, d 64, T 64; D = 1 and 2). Greedy is
// plain greedy's token for token; the tokens/s are printed (the machine is
// shared: speed is measured, never asserted).
TEST(SpeculativeSpeed, DeepModelOneLayerDrafts) {
  at::set_num_threads(1);
  for (int64_t depth : {1, 2}) {
    at::manual_seed(13);
    ModelConfig m = tiny(FfnKind::Dense);
    m.model_dimension = 64;
    m.layers_per_block = 8;
    m.T = 64;
    m.mlp_hidden = 0;
    m.mtp_depth = depth;
    LayerFactory f;
    f.set_seed(7);
    Transformer model(m, f);
    train(model, 150);
    expect_same_as_greedy(model, "8 layers, d 64, D = " + std::to_string(depth) + ", trained", 0.8);
  }
}

// Within T (no restart, no slide) the cached and uncached paths see the same
// windows, so the MTP modules on their caches must draft from the same q as
// over the whole window: sampled at temperature 1 from one seed, both paths
// keep the same tokens (their p and q differ by rounding only).
TEST(SpeculativeSampling, ModuleCachesDraftAsTheWholeWindow) {
  at::set_num_threads(1);
  for (AttentionKind attention : {AttentionKind::Mha, AttentionKind::Mla}) {
    ModelConfig m = tiny(FfnKind::Dense, attention);
    m.init_std = 0.3;  // peaked distributions: some drafts kept, some not
    LayerFactory f;
    f.set_seed(3);
    Transformer model(m, f);
    SampleOptions o;
    o.temperature = 1.0;
    o.max_tokens = 27;  // prompts of up to 5: the context stays within T = 32
    o.seed = 23;
    std::vector<std::vector<int32_t>> prompts;
    for (int32_t i = 0; i < 12; ++i) prompts.push_back({i, (i * 7) % 48, (i * 13 + 5) % 48, 30, (i * 3) % 48});
    SpeculativeStats whole, cached;
    o.use_cache = false;
    const auto a = generate_speculative(model, prompts, o, &whole);
    o.use_cache = true;
    const auto b = generate_speculative(model, prompts, o, &cached);
    EXPECT_EQ(a, b) << (attention == AttentionKind::Mla ? "mla" : "mha");
    EXPECT_EQ(whole.accepted, cached.accepted);
    EXPECT_EQ(whole.drafted, cached.drafted);
    // Both branches of the rule ran, and the modules drafted over many rounds.
    EXPECT_GT(cached.accepted, cached.drafted / 20);
    EXPECT_LT(cached.accepted, cached.drafted - cached.drafted / 20);
    std::printf("%s, temperature 1, within T: acceptance %.3f (%lld of %lld) with the caches and without\n",
                attention == AttentionKind::Mla ? "mla" : "mha", cached.acceptance(),
                static_cast<long long>(cached.accepted), static_cast<long long>(cached.drafted));
  }
}

// Past T the cached paths restart on the last T/2 tokens and the uncached ones
// slide: on a model whose argmax hangs on the whole context (large weights),
// where those two differ, speculative decoding follows each exactly.
TEST(SpeculativeGreedy, FollowsEachPathsWindowPastT) {
  for (FfnKind ffn : {FfnKind::Dense, FfnKind::Moe}) {
    ModelConfig m = tiny(ffn);
    m.init_std = 0.5;
    LayerFactory f;
    f.set_seed(9);
    Transformer model(m, f);
    const std::vector<std::vector<int32_t>> prompts = {{1, 4, 7}, {10, 13, 2, 2, 40}, {31}};
    SampleOptions o;
    o.temperature = 0;
    o.max_tokens = 80;  // with a prompt of 3 the cache restarts before new tokens 30, 47 and 64 (from 0)
    for (bool cache : {false, true}) {
      o.use_cache = cache;
      EXPECT_EQ(generate_speculative(model, prompts, o, nullptr), generate(model, prompts, o)) << "cache " << cache;
    }
    // The two windows give different tokens, so a wrong window shows.
    o.use_cache = false;
    const auto uncached = generate(model, prompts, o);
    o.use_cache = true;
    EXPECT_NE(uncached, generate(model, prompts, o));
  }
}

// Cut back to 3 of 5 positions, a cache continues as one that held only those 3.
TEST(KVCacheTruncate, ContinuesAsTheShorterCache) {
  for (AttentionKind attention : {AttentionKind::Mha, AttentionKind::Mla}) {
    LayerFactory f;
    Transformer model(tiny(FfnKind::Dense, attention), f);
    model.eval();
    at::NoGradGuard no_grad;
    const at::Tensor first = at::tensor({3, 9, 27, 5, 8}, at::kLong).view({1, -1});
    const at::Tensor then = at::tensor({40, 2}, at::kLong).view({1, -1});
    KVCache cut, fresh;
    model.forward_layers(model.embed(first), nullptr, &cut);
    cut.truncate(3);
    model.forward_layers(model.embed(first.narrow(1, 0, 3)), nullptr, &fresh);
    EXPECT_EQ(cut.length, 3);
    EXPECT_EQ(cut.bytes(), fresh.bytes());
    const at::Tensor a = model.forward_layers(model.embed(then), nullptr, &cut);
    const at::Tensor b = model.forward_layers(model.embed(then), nullptr, &fresh);
    EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-6)) << (a - b).abs().max().item<float>();
    EXPECT_THROW(cut.truncate(6), Error);
  }
}

// An MTP module on a cache, fed positions 0..4 then 5..6, gives what it gives
// over all 7 at once (MHA and MLA, whose cache holds the latent).
TEST(MtpModuleCache, PiecesAsTheWhole) {
  for (AttentionKind attention : {AttentionKind::Mha, AttentionKind::Mla}) {
    LayerFactory f;
    f.set_seed(4);
    Transformer model(tiny(FfnKind::Dense, attention), f);
    model.eval();
    at::NoGradGuard no_grad;
    MtpModule& module = *std::dynamic_pointer_cast<MtpModule>(model.named_modules("", /*include_self=*/false)["mtp.1"]);
    const at::Tensor h = at::randn({1, 7, 32}), emb = at::randn({1, 7, 32});
    const at::Tensor whole = module.forward(h, emb, nullptr, nullptr);
    LayerCache cache;
    const at::Tensor first = module.forward(h.narrow(1, 0, 5), emb.narrow(1, 0, 5), cache, 0);
    const at::Tensor then = module.forward(h.narrow(1, 5, 2), emb.narrow(1, 5, 2), cache, 5);
    const at::Tensor pieces = at::cat({first, then}, 1);
    EXPECT_TRUE(at::allclose(pieces, whole, 1e-5, 1e-6)) << (pieces - whole).abs().max().item<float>();
  }
}

// The model's distributions of new token `index` after each row of contexts [B, t].
at::Tensor next_distributions(Transformer& model, const at::Tensor& contexts, const SampleOptions& o,
                              int64_t index) {
  const at::Tensor h = model.forward_layers(model.embed(contexts), nullptr);
  const at::Tensor logits = model.logits(h.narrow(1, h.size(1) - 1, 1)).squeeze(1);
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < logits.size(0); ++b) rows.push_back(token_distribution(logits[b], o, index >= o.min_tokens));
  return at::stack(rows).to(at::kDouble);
}

// Contexts: the prompt, then each of the K^n continuations by n tokens below
// K; row r continues with r's base-K digits, most significant first.
at::Tensor continuations(const std::vector<int64_t>& prompt, int64_t K, int64_t n) {
  int64_t rows = 1;
  for (int64_t i = 0; i < n; ++i) rows *= K;
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < rows; ++r) {
    ids.insert(ids.end(), prompt.begin(), prompt.end());
    for (int64_t place = rows / K; place >= 1; place /= K) ids.push_back(r / place % K);
  }
  return at::tensor(ids, at::kLong).view({rows, -1});
}

std::vector<double> as_vector(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous().view({-1});
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

// Temperature 1 over 6 ids, the top 4 of them (so p and q often differ in
// support), 5 the stop token (never the first: min_tokens 1), 3 new tokens at
// most: the first token comes from a plain step, the next two from a chain of
// 2 drafts. The joint of (x1, x2) and of (x2, x3) (stop as an
// outcome) of 6000 samples against the exact ones from the model's logits.
TEST(SpeculativeSampling, FirstTokensFollowTheModelsDistribution) {
  at::set_num_threads(1);
  ModelConfig m = tiny(FfnKind::Dense);
  m.init_std = 0.3;  // peaked distributions, unlike between the model and its MTP modules
  LayerFactory f;
  f.set_seed(3);
  Transformer model(m, f);
  model.eval();
  at::NoGradGuard no_grad;
  constexpr int64_t K = 6, kStop = 5, N = 6000;
  SampleOptions o;
  o.temperature = 1.0;
  o.vocab_limit = K;
  o.top_k = 4;
  o.stop_token = kStop;
  o.min_tokens = 1;
  o.max_tokens = 3;
  o.seed = 17;
  const std::vector<int64_t> prompt = {7, 20, 3, 41};
  const at::Tensor p1 = next_distributions(model, continuations(prompt, K, 0), o, 0)[0];  // [K]
  const at::Tensor p2 = next_distributions(model, continuations(prompt, K, 1), o, 1);     // [K, K]: x1, x2
  const at::Tensor p3 = next_distributions(model, continuations(prompt, K, 2), o, 2).view({K, K, K});
  const at::Tensor joint12 = p1.unsqueeze(1) * p2;                    // x1, x2 (x2 = stop: the sample ends)
  const at::Tensor joint123 = joint12.unsqueeze(2) * p3;              // x1, x2, x3
  std::vector<double> exact12 = as_vector(joint12);
  // (x2, x3) for x2 below the stop token, then the cell "x2 is the stop token".
  std::vector<double> exact23 = as_vector(joint123.sum(0).narrow(0, 0, kStop));
  exact23.push_back(joint12.select(1, kStop).sum().item<double>());
  std::vector<int64_t> counts12(K * K, 0), counts23(exact23.size(), 0);
  SpeculativeStats st;
  const std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(N),
                                                  std::vector<int32_t>(prompt.begin(), prompt.end()));
  for (const auto& s : generate_speculative(model, prompts, o, &st)) {
    ASSERT_FALSE(s.empty());
    const int64_t x1 = s[0], x2 = s.size() > 1 ? s[1] : kStop, x3 = s.size() > 2 ? s[2] : kStop;
    ++counts12[static_cast<size_t>(x1 * K + x2)];
    ++counts23[static_cast<size_t>(x2 == kStop ? kStop * K : x2 * K + x3)];
  }
  const test::ChiSquare c12 = test::chi_square(exact12, counts12), c23 = test::chi_square(exact23, counts23);
  EXPECT_TRUE(c12.fits()) << "(x1, x2): " << c12.str();
  EXPECT_TRUE(c23.fits()) << "(x2, x3): " << c23.str();
  // Some drafts were rejected and some kept, so both branches of the rule ran.
  EXPECT_GT(st.accepted, st.drafted / 20);
  EXPECT_LT(st.accepted, st.drafted - st.drafted / 20);
  std::printf("temperature 1: (x1, x2) %s; (x2, x3) %s; acceptance %.3f (%lld of %lld)\n", c12.str().c_str(),
              c23.str().c_str(), st.acceptance(), static_cast<long long>(st.accepted),
              static_cast<long long>(st.drafted));
}

TEST(SpeculativeRefusals, NeedsMtpAndGoodPrompts) {
  LayerFactory f;
  ModelConfig m = tiny(FfnKind::Dense);
  SampleOptions o;
  m.mtp_depth = 0;
  Transformer plain(m, f);
  try {
    generate_speculative(plain, {{1}}, o, nullptr);
    ADD_FAILURE() << "a model without MTP modules was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model_config.mtp_depth"), std::string::npos) << e.what();
  }
  LayerFactory g;
  Transformer with(tiny(FfnKind::Dense), g);
  EXPECT_THROW(generate_speculative(with, {{}}, o, nullptr), Error);
  EXPECT_THROW(generate_speculative(with, {{48}}, o, nullptr), Error);
  // Temperature > 0 samples now (it was refused before speculative sampling).
  o.temperature = 1.0;
  o.max_tokens = 4;
  EXPECT_EQ(generate_speculative(with, {{1, 2}}, o, nullptr).at(0).size(), 4u);
}

}  // namespace
}  // namespace meshtrain
