// Sampling loop: prefill + one-token decode with the KV cache, or full re-runs.
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/sampling/generate.h"

namespace meshtrain {

namespace {

// Stands for "the logits were not finite" where a token id is shared, so
// every pipeline stage learns it from the last one and all ranks throw alike.
constexpr int32_t kNonFinite = std::numeric_limits<int32_t>::min();

// Next token from logits [V]: argmax at temperature 0, else top-k sampling.
// Ranks that do not compute logits (pipeline stages before the last) return -1
// and learn the token from share(). allow_stop false: the stop token cannot
// be drawn (min_tokens, as Hugging Face's min_new_tokens).
int32_t sample(const at::Tensor& logits, const SampleOptions& o, at::Generator& gen, bool allow_stop) {
  if (!logits.defined()) return -1;
  const at::Tensor probs = token_distribution(logits, o, allow_stop);
  // softmax/multinomial would fail with a raw libtorch error (or argmax pick NaN).
  if (!probs.defined()) return kNonFinite;
  if (o.temperature <= 0.0) return static_cast<int32_t>(probs.argmax().item<int64_t>());
  return static_cast<int32_t>(at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>());
}

at::Tensor as_batch(const std::vector<int32_t>& tokens, size_t begin, const at::Device& device) {
  std::vector<int64_t> ids(tokens.begin() + static_cast<std::ptrdiff_t>(begin), tokens.end());
  return at::tensor(ids, at::TensorOptions().dtype(at::kLong)).view({1, -1}).to(device);
}

std::vector<int32_t> continue_one(const ModelConfig& cfg, const ForwardFn& last_logits, const ShareFn& share,
                                  std::vector<int32_t> seq, const SampleOptions& o, at::Generator& gen,
                                  const at::Device& device) {
  const auto T = static_cast<size_t>(cfg.T);
  const size_t prompt_len = seq.size();
  KVCache cache;
  at::Tensor logits;
  for (int64_t step = 0; step < o.max_tokens; ++step) {
    if (o.check_stop) o.check_stop();
    if (!o.use_cache) {
      logits = last_logits(as_batch(seq, seq.size() - std::min(seq.size(), T), device), nullptr);
    } else if (step == 0 || cache.length >= static_cast<int64_t>(T)) {
      // Restart from half the context, so a full cache costs one prefill per
      // T/2 tokens rather than one per token.
      const size_t keep = step == 0 ? std::min(seq.size(), T) : std::max<size_t>(T / 2, 1);
      cache = KVCache{};
      logits = last_logits(as_batch(seq, seq.size() - keep, device), &cache);
    } else {
      logits = last_logits(as_batch(seq, seq.size() - 1, device), &cache);
    }
    const int32_t token = share(sample(logits, o, gen, /*allow_stop=*/step >= o.min_tokens));
    if (token == kNonFinite)
      throw NonFiniteLogits("sampling: the model's logits are NaN or infinite at new token " +
                            std::to_string(step + 1));
    if (o.stop_token >= 0 && token == o.stop_token) break;
    seq.push_back(token);
  }
  return {seq.begin() + static_cast<std::ptrdiff_t>(prompt_len), seq.end()};
}

}  // namespace

at::Tensor token_distribution(at::Tensor logits, const SampleOptions& o, bool allow_stop) {
  logits = logits.to(at::kCPU, at::kFloat);
  if (o.vocab_limit > 0 && o.vocab_limit < logits.size(-1)) logits = logits.narrow(-1, 0, o.vocab_limit);
  if (!at::isfinite(logits).all().item<bool>()) return {};
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  if (!allow_stop && o.stop_token >= 0 && o.stop_token < logits.size(-1)) {
    logits = logits.clone();
    logits.select(-1, o.stop_token).fill_(kNever);
  }
  if (o.temperature <= 0.0) return at::zeros_like(logits).scatter_(-1, logits.argmax(-1, /*keepdim=*/true), 1.0);
  logits = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < logits.size(-1)) {
    const at::Tensor kth = std::get<0>(logits.topk(o.top_k)).narrow(-1, o.top_k - 1, 1);  // sorted: the k-th largest
    logits = logits.masked_fill(logits < kth, kNever);
  }
  return at::softmax(logits, -1);
}

std::vector<std::vector<int32_t>> generate(const ModelConfig& cfg, const at::Device& device, const ForwardFn& forward,
                                           const ShareFn& share, const std::vector<std::vector<int32_t>>& prompts,
                                           const SampleOptions& options) {
  MT_CHECK(options.max_tokens >= 0, "max_tokens must be >= 0, got ", options.max_tokens);
  MT_CHECK(options.top_k >= 0, "top_k must be >= 0, got ", options.top_k);
  const int64_t V = cfg.vocab_size;
  for (const auto& p : prompts) {
    MT_CHECK(!p.empty(), "generate: empty prompt (hint: start it with at least one token)");
    for (int32_t t : p) MT_CHECK(t >= 0 && t < V, "generate: prompt token ", t, " outside the vocabulary [0, ", V, ")");
  }
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) out.push_back(continue_one(cfg, forward, share, p, options, gen, device));
  return out;
}

std::vector<std::vector<int32_t>> generate(Transformer& model, const std::vector<std::vector<int32_t>>& prompts,
                                           const SampleOptions& options) {
  MT_CHECK(model.embedding() && model.head(), "generate needs a single-stage model (embedding and head)");
  const auto params = model.parameters();
  const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().device();
  // Logits [V] at the last position of `context` (a [1, t] token tensor).
  ForwardFn forward = [&model](const at::Tensor& context, KVCache* cache) {
    const auto h = model.forward_layers(model.embed(context), nullptr, cache);
    return model.logits(h.narrow(1, h.size(1) - 1, 1)).view({-1});
  };
  ShareFn same = [](int32_t token) { return token; };
  const bool was_training = model.is_training();
  model.eval();
  try {
    auto out = generate(model.config(), device, forward, same, prompts, options);
    model.train(was_training);
    return out;
  } catch (...) {
    model.train(was_training);
    throw;
  }
}

}  // namespace meshtrain
