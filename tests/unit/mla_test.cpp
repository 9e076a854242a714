// Incremental decoding: the KV cache (MHA: k and v; MLA: latent + rope key)
// reproduces the full forward, and generation with and without it agrees.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "meshtrain/model/attention.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/ops/fused.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/sampling/generate.h"

namespace meshtrain {
namespace {

ModelConfig tiny(const std::string& attention) {
  ModelConfig c;
  c.model_dimension = 32;
  c.vocab_size = 53;
  c.n_head = 4;
  c.blocks = 1;
  c.layers_per_block = 3;  // MLA: layers 0, 1 with rope, layer 2 with dhR = 0
  c.T = 16;
  c.attention = attention == "mha" ? AttentionKind::Mha : AttentionKind::Mla;  // "jaxformer": MLA, options below
  c.latent_dim = 12;
  c.dhR = 4;
  c.init_std = 0.1;
  if (attention == "jaxformer") {
    // Jaxformer's layer (docs/JAXFORMER.md): biases, rope from the joint
    // latent, and a MoE feed-forward in the block's last layer.
    c.attention = AttentionKind::Mla;
    c.linear_bias = c.norm_bias = true;
    c.mla_rope_input = MlaRopeInput::JointLatent;
    c.ffn = FfnKind::Moe;
    c.moe_layers = MoeLayers::LastInBlock;
    c.n_experts = 4;
    c.k = 2;
    c.n_shared = 2;
    c.shared_expert = SharedExpert::Linear;
    c.router_score = RouterScore::Sigmoid;
  }
  return c;
}

at::Tensor random_tokens(const ModelConfig& c, int64_t B, int64_t T, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(c.vocab_size, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
}

class Decode : public ::testing::TestWithParam<std::string> {};

TEST_P(Decode, CachedChunksMatchTheFullForward) {
  const auto cfg = tiny(GetParam());
  LayerFactory f;
  Transformer m(cfg, f);
  m.eval();
  torch::NoGradGuard no_grad;
  const auto x = random_tokens(cfg, 2, cfg.T, 1);
  const auto full = m.logits(m.forward_layers(m.embed(x), nullptr));

  // Prefill 5, then 3 at once on top of the cache (explicit mask), then one by one.
  KVCache cache;
  std::vector<at::Tensor> parts;
  std::vector<int64_t> chunks{5, 3};
  while (std::accumulate(chunks.begin(), chunks.end(), int64_t{0}) < cfg.T) chunks.push_back(1);
  int64_t pos = 0;
  for (int64_t n : chunks) {
    parts.push_back(m.logits(m.forward_layers(m.embed(x.narrow(1, pos, n)), nullptr, &cache)));
    pos += n;
    EXPECT_EQ(cache.length, pos);
  }
  const auto inc = at::cat(parts, 1);
  EXPECT_LT((inc - full).abs().max().item<double>(), 1e-5);
  EXPECT_GT(full.std().item<double>(), 1e-2);  // the comparison is not between near-constants

  // Overflowing the context is an error, not silent garbage.
  EXPECT_THROW(m.forward_layers(m.embed(x.narrow(1, 0, 1)), nullptr, &cache), std::exception);
}

INSTANTIATE_TEST_SUITE_P(Attention, Decode, ::testing::Values("mha", "mla", "jaxformer"));

TEST(Decode, RopeMattersSoPositionsAreChecked) {
  // A cache fed at the wrong offset must give different logits, or the test
  // above could pass with positions ignored.
  const auto cfg = tiny("mla");
  LayerFactory f;
  Transformer m(cfg, f);
  m.eval();
  torch::NoGradGuard no_grad;
  const auto x = random_tokens(cfg, 1, 6, 2);
  KVCache a, b;
  m.forward_layers(m.embed(x.narrow(1, 0, 5)), nullptr, &a);
  const auto right = m.logits(m.forward_layers(m.embed(x.narrow(1, 5, 1)), nullptr, &a));
  m.forward_layers(m.embed(x.narrow(1, 0, 5)), nullptr, &b);
  b.length += 3;  // pretend the new token sits 3 positions later
  const auto wrong = m.logits(m.forward_layers(m.embed(x.narrow(1, 5, 1)), nullptr, &b));
  EXPECT_GT((right - wrong).abs().max().item<double>(), 1e-4);
}

TEST(Cache, MlaHoldsOnlyLatentAndRopeKey) {
  const int64_t B = 2, t = 7;
  LayerFactory f;
  Transformer mla(tiny("mla"), f), mha(tiny("mha"), f);
  mla.eval();
  mha.eval();
  torch::NoGradGuard no_grad;
  const auto x = random_tokens(tiny("mla"), B, t, 3);
  KVCache cm, ch;
  mla.forward_layers(mla.embed(x), nullptr, &cm);
  mha.forward_layers(mha.embed(x), nullptr, &ch);
  ASSERT_EQ(cm.layers.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(cm.layers[i].a.sizes(), (std::vector<int64_t>{B, t, 12}));
    EXPECT_EQ(cm.layers[i].b.sizes(), (std::vector<int64_t>{B, t, 4}));
  }
  EXPECT_EQ(cm.layers[2].a.sizes(), (std::vector<int64_t>{B, t, 12}));
  EXPECT_FALSE(cm.layers[2].b.defined());  // dhR = 0: no rope key at all
  EXPECT_EQ(ch.layers[0].a.sizes(), (std::vector<int64_t>{B, 4, t, 8}));
  const int64_t f32 = 4;
  EXPECT_EQ(cm.bytes(), B * t * f32 * (3 * 12 + 2 * 4));
  EXPECT_EQ(ch.bytes(), B * t * f32 * 3 * 2 * 32);
  EXPECT_LT(cm.bytes() * 4, ch.bytes());
}

class Generate : public ::testing::TestWithParam<std::string> {};

TEST_P(Generate, GreedyWithAndWithoutCacheAgree) {
  const auto cfg = tiny(GetParam());
  LayerFactory f;
  Transformer m(cfg, f);
  m.train();
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3, 4}, {7, 30}};
  SampleOptions o;
  o.max_tokens = 12;  // prompt + continuation fit in T
  o.temperature = 0;
  o.use_cache = true;
  const auto cached = generate(m, prompts, o);
  o.use_cache = false;
  const auto plain = generate(m, prompts, o);
  EXPECT_EQ(cached, plain);
  ASSERT_EQ(cached.size(), 2u);
  EXPECT_EQ(cached[0].size(), 12u);
  EXPECT_TRUE(m.is_training());  // restored

  // top_k = 1 is greedy at any temperature.
  o.temperature = 1.5;
  o.top_k = 1;
  EXPECT_EQ(generate(m, prompts, o), plain);

  // Beyond T both paths still produce tokens (the cache restarts when full).
  o.top_k = 0;
  o.max_tokens = 40;
  o.use_cache = true;
  const auto long_run = generate(m, prompts, o);
  EXPECT_EQ(long_run[1].size(), 40u);
  for (int32_t t : long_run[1]) EXPECT_TRUE(t >= 0 && t < cfg.vocab_size);
}

INSTANTIATE_TEST_SUITE_P(Attention, Generate, ::testing::Values("mha", "mla"));

TEST(Generate, SamplingRepeatsForASeedAndVariesAcrossSeeds) {
  const auto cfg = tiny("mla");
  LayerFactory f;
  Transformer m(cfg, f);
  SampleOptions o;
  o.max_tokens = 12;
  o.temperature = 2.0;
  o.seed = 5;
  const std::vector<std::vector<int32_t>> prompts{{3}};
  const auto a = generate(m, prompts, o);
  EXPECT_EQ(generate(m, prompts, o), a);
  o.seed = 6;
  EXPECT_NE(generate(m, prompts, o), a);
  EXPECT_THROW(generate(m, {{}}, o), std::exception);
  EXPECT_THROW(generate(m, {{999}}, o), std::exception);
}

// A model whose vocabulary is padded past the tokenizer's (GPT-2's 50304 for
// 50257) must never sample a padding id: the tokenizer cannot decode it.
TEST(Generate, VocabLimitKeepsSamplesInsideTheTokenizer) {
  const auto cfg = tiny("mha");
  LayerFactory f;
  Transformer m(cfg, f);
  SampleOptions o;
  o.max_tokens = 64;
  o.temperature = 2.0;  // flat: unlimited, ids past the limit are all but certain
  o.seed = 1;
  const std::vector<std::vector<int32_t>> prompts{{3}, {5, 6}};
  const int64_t limit = cfg.vocab_size / 8;
  auto max_id = [](const std::vector<std::vector<int32_t>>& out) {
    int32_t m = -1;
    for (const auto& row : out)
      for (int32_t t : row) m = std::max(m, t);
    return m;
  };
  EXPECT_GE(max_id(generate(m, prompts, o)), limit) << "the test needs samples past the limit without one";
  o.vocab_limit = limit;
  EXPECT_LT(max_id(generate(m, prompts, o)), limit);
  o.temperature = 0;  // greedy too
  EXPECT_LT(max_id(generate(m, prompts, o)), limit);
}

// A sample ends where the stop token (the tokenizer's end-of-text) is drawn,
// without it: the same draws as without the stop, cut there.
TEST(Generate, StopTokenEndsTheSample) {
  const auto cfg = tiny("mla");
  LayerFactory f;
  Transformer m(cfg, f);
  SampleOptions o;
  o.max_tokens = 40;
  o.temperature = 1.0;
  o.seed = 3;
  const std::vector<std::vector<int32_t>> prompts{{3}, {5, 6}};
  for (size_t p = 0; p < prompts.size(); ++p) {
    // One prompt per call: a batch of prompts draws from one generator in turn.
    o.stop_token = -1;
    const auto full = generate(m, {prompts[p]}, o)[0];
    ASSERT_EQ(full.size(), 40u);
    // Stop at the token drawn 6th: the sample is what came before its first draw.
    o.stop_token = full[5];
    const auto first = std::find(full.begin(), full.end(), o.stop_token) - full.begin();
    const auto stopped = generate(m, {prompts[p]}, o);
    EXPECT_EQ(stopped[0], std::vector<int32_t>(full.begin(), full.begin() + first)) << "prompt " << p;
    SampleOptions g;  // greedy stops too
    g.max_tokens = 40;
    g.temperature = 0;
    const auto greedy = generate(m, {prompts[p]}, g)[0];
    g.stop_token = greedy[2];
    const auto g_first = std::find(greedy.begin(), greedy.end(), g.stop_token) - greedy.begin();
    EXPECT_EQ(generate(m, {prompts[p]}, g)[0], std::vector<int32_t>(greedy.begin(), greedy.begin() + g_first));
  }
}

// min_tokens (Hugging Face's min_new_tokens): the stop token is left out of
// the first min_tokens draws, so a model that would end the sample at once
// still shows text.
TEST(Generate, MinTokensKeepTheStopTokenOutOfTheFirstDraws) {
  const auto cfg = tiny("mla");
  LayerFactory f;
  Transformer m(cfg, f);
  SampleOptions g;
  g.max_tokens = 12;
  g.temperature = 0;
  const std::vector<int32_t> prompt{3};
  const auto greedy = generate(m, {prompt}, g)[0];
  g.stop_token = greedy[0];  // the very first token: the sample would be empty
  EXPECT_TRUE(generate(m, {prompt}, g)[0].empty());
  g.min_tokens = 4;
  const auto shown = generate(m, {prompt}, g)[0];
  ASSERT_GE(shown.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(shown[i], g.stop_token) << "draw " << i;
}

// MLA's attention on GPUs pads v to the q/k head size (hd + dhR) so flash
// kernels apply, and keeps v's hd output columns: the same outputs and
// gradients as attention over the unpadded v (which CPU kernels take), for
// training (Tq == Tk) and for decoding with a cache (Tq == 1, 1 < Tq < Tk).
TEST(MlaAttention, PaddedValuesGiveTheUnpaddedOutputsAndGradients) {
  at::manual_seed(0);
  const int64_t B = 2, H = 3, hd = 16, dhR = 8;
  for (auto [Tq, Tk] : {std::pair<int64_t, int64_t>{12, 12}, {1, 12}, {5, 12}}) {
    SCOPED_TRACE("Tq " + std::to_string(Tq) + ", Tk " + std::to_string(Tk));
    const at::Tensor q0 = at::randn({B, H, Tq, hd + dhR}), k0 = at::randn({B, H, Tk, hd + dhR});
    const at::Tensor v0 = at::randn({B, H, Tk, hd}), dout = at::randn({B, H, Tq, hd});
    // width -1: unpadded; 0: padded to q's size; 20: part of the way.
    auto run = [&](int64_t width) {
      at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
      at::Tensor v = v0.clone().requires_grad_(true);
      const at::Tensor o = width >= 0 ? causal_attention_padded_v(q, k, v, 0.0, width) : causal_attention(q, k, v, 0.0);
      o.backward(dout);
      return std::vector<at::Tensor>{o.detach(), q.grad(), k.grad(), v.grad()};
    };
    const std::vector<at::Tensor> want = run(-1);
    for (int64_t width : {0, 20}) {
      const std::vector<at::Tensor> got = run(width);
      EXPECT_EQ(got[0].sizes(), want[0].sizes());
      const char* names[] = {"output", "dq", "dk", "dv"};
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_TRUE(at::allclose(got[i], want[i], 1e-5, 1e-6))
            << names[i] << " at width " << width << ": max diff " << (got[i] - want[i]).abs().max().item<float>();
    }
  }
  // Equal sizes need no padding; q and k must agree.
  const at::Tensor x = at::randn({1, 2, 4, 8});
  EXPECT_TRUE(at::equal(causal_attention_padded_v(x, x, x, 0.0), causal_attention(x, x, x, 0.0)));
  EXPECT_ANY_THROW(causal_attention_padded_v(x, at::randn({1, 2, 4, 6}), x, 0.0));
  EXPECT_ANY_THROW(causal_attention_padded_v(x, x, at::randn({1, 2, 4, 6}), 0.0, 4));
}

// The MLA layer against its plain composition from the same parameters:
// each projection its own GEMM, the queries' rope rotated and then
// concatenated, v unpadded (the layer fuses the projections of x into one
// GEMM and rotates the rope queries into their concatenation). Outputs and
// every gradient, x's included, in fp32.
TEST(MlaAttention, LayerMatchesItsPlainCompositionWithGradients) {
  at::manual_seed(1);
  ModelConfig c = tiny("mla");
  c.dropout_rate = 0.0;
  LayerFactory f;
  MLA mla(c, f, "attn", c.dhR);
  const int64_t B = 2, T = 7, H = c.n_head, hd = c.head_dim(), dhR = c.dhR;
  const at::Tensor x = at::randn({B, T, c.model_dimension}).requires_grad_(true);
  const at::Tensor g = at::randn({B, T, c.model_dimension});
  mla.forward(x, nullptr, 0).backward(g);
  std::map<std::string, at::Tensor> grads;
  for (auto& p : mla.named_parameters()) grads[p.key()] = p.value().grad().clone();
  const at::Tensor dx = x.grad().clone();

  mla.zero_grad();
  x.mutable_grad().reset();
  auto w = [&](const std::string& name) { return *mla.named_parameters().find(name + ".weight"); };
  auto heads = [&](const at::Tensor& t, int64_t dim) { return t.view({B, T, -1, dim}).transpose(1, 2); };
  const auto tables = ops::rope_tables(dhR, T, c.rope_theta, at::kCPU);
  const at::Tensor lat = at::linear(x, w("w_dkv")), latq = at::linear(x, w("w_dq"));
  const at::Tensor q = at::cat({heads(at::linear(latq, w("w_uq")), hd),
                                ops::rope(heads(at::linear(latq, w("w_qr")), dhR), tables, 0, 2)}, -1);
  const at::Tensor kr = ops::rope(at::linear(x, w("w_kr")), tables, 0, 1);
  const at::Tensor k = at::cat({heads(at::linear(lat, w("w_uk")), hd), kr.unsqueeze(1).expand({B, H, T, dhR})}, -1);
  const at::Tensor v = heads(at::linear(lat, w("w_uv")), hd);
  const at::Tensor o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  at::linear(o.transpose(1, 2).reshape({B, T, H * hd}), w("wo")).backward(g);
  EXPECT_LT((dx - x.grad()).abs().max().item<double>(), 1e-5) << "dx";
  for (auto& p : mla.named_parameters())
    EXPECT_LT((grads[p.key()] - p.value().grad()).abs().max().item<double>(), 1e-5) << p.key();
  EXPECT_EQ(grads.size(), 8u);
}

// How far v is padded: no further than the kernel sdpa would run at q's
// width needs. Choosers stand in for torch's per-GPU rules (1 flash, 2
// memory-efficient, 3 cuDNN, 0 math); the CPU takes unequal widths as they
// are, the meta device (the performance model) prices flash's full padding.
TEST(MlaAttention, ValuesArePaddedOnlyAsFarAsTheKernelNeeds) {
  std::vector<int64_t> asked;
  const auto cudnn_any = [&](int64_t w) { return asked.push_back(w), int64_t{3}; };
  EXPECT_EQ(narrowest_value_width(64, 192, cudnn_any), 64);
  EXPECT_EQ(asked, (std::vector<int64_t>{192, 64}));
  // Flash at equal sizes, the memory-efficient kernel below: padded all the way.
  const auto flash_equal = [](int64_t w) { return w == 192 ? int64_t{1} : int64_t{2}; };
  EXPECT_EQ(narrowest_value_width(64, 192, flash_equal), 192);
  // A kernel that takes v up to 128: the first multiple of 64 it takes.
  const auto up_to_128 = [](int64_t w) { return w == 128 || w == 192 ? int64_t{3} : int64_t{0}; };
  EXPECT_EQ(narrowest_value_width(40, 192, up_to_128), 128);
  asked.clear();
  EXPECT_EQ(narrowest_value_width(40, 200, [&](int64_t w) { return asked.push_back(w), w == 200 ? 1 : 0; }), 200);
  EXPECT_EQ(asked, (std::vector<int64_t>{200, 40, 64, 128, 192}));
  EXPECT_EQ(narrowest_value_width(192, 192, flash_equal), 192);
  EXPECT_ANY_THROW(narrowest_value_width(200, 192, flash_equal));

  const at::Tensor q = at::randn({1, 2, 4, 24}), v = at::randn({1, 2, 4, 16});
  EXPECT_EQ(value_width_for(q, q, v, 0.0), 16);
  const auto meta = at::TensorOptions().device(at::kMeta);
  EXPECT_EQ(value_width_for(at::empty({1, 2, 4, 24}, meta), at::empty({1, 2, 4, 24}, meta),
                            at::empty({1, 2, 4, 16}, meta), 0.0),
            24);
}

}  // namespace
}  // namespace meshtrain
