// Self-speculative decoding and sampling with the MTP modules (see speculative.h).
#include "meshtrain/sampling/speculative.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/model/mtp.h"
#include "meshtrain/sampling/speculative_rule.h"

namespace meshtrain {

namespace {

std::vector<MtpModule*> mtp_modules(Transformer& model) {
  std::vector<MtpModule*> out;
  const auto all = model.named_modules("", /*include_self=*/false);
  for (int64_t j = 0; j < model.mtp_depth(); ++j) {
    const auto* m = all.find("mtp." + std::to_string(j));
    MT_ASSERT(m != nullptr, "the model has no module mtp.", j);
    out.push_back(dynamic_cast<MtpModule*>(m->get()));
    MT_ASSERT(out.back() != nullptr, "mtp.", j, " is not a multi-token prediction module");
  }
  return out;
}

at::Tensor row(const std::vector<int64_t>& ids, const at::Device& device) {
  return at::tensor(ids, at::TensorOptions().dtype(at::kLong)).view({1, -1}).to(device);
}

template <typename C>
int64_t ssize(const C& c) {
  return static_cast<int64_t>(c.size());
}

// One prompt's continuation. The main model sees the window ctx_[ws_..) (its
// position 0 at ws_), placed as generate() places it, so each kept token is
// drawn from the distribution plain sampling draws it from.
class Decoder {
 public:
  Decoder(Transformer& model, const std::vector<MtpModule*>& mtp, const SampleOptions& o, at::Generator& gen,
          SpeculativeStats& st)
      : model_(model), mtp_(mtp), o_(o), gen_(gen), st_(st), T_(model.config().T),
        device_(model.parameters().front().device()) {}

  std::vector<int32_t> run(const std::vector<int32_t>& prompt) {
    ctx_.assign(prompt.begin(), prompt.end());
    ws_ = std::max<int64_t>(0, ssize(ctx_) - T_);
    while (ssize(out_) < o_.max_tokens) {
      if (o_.check_stop) o_.check_stop();
      place_window();
      if (!verify()) break;
      draft();
    }
    return out_;
  }

 private:
  // Without the cache every token sees the last T tokens; with it, as
  // generate()'s cache: once a token's context would pass T, the window
  // starts again at the last T/2 tokens (drafts never cross that: draft()).
  void place_window() {
    const int64_t J = ssize(ctx_);
    if (!o_.use_cache) {
      ws_ = std::max<int64_t>(0, J - T_);
    } else if (J - ws_ > T_) {
      MT_ASSERT(drafts_.empty(), "speculative decoding: drafts past the context length T=", T_);
      ws_ = J - std::max<int64_t>(T_ / 2, 1);
      cache_ = KVCache{};
      mtp_cache_ = KVCache{};
      hidden_ = at::Tensor();
    }
  }

  // The distributions plain sampling draws new tokens first.. from, one per
  // row of logits [n, V] (those before min_tokens without the stop token).
  at::Tensor distributions(const at::Tensor& logits, int64_t first, const std::string& what) {
    const int64_t n = logits.size(0), masked = std::clamp<int64_t>(o_.min_tokens - first, 0, n);
    std::vector<at::Tensor> parts;
    if (masked > 0) parts.push_back(token_distribution(logits.narrow(0, 0, masked), o_, /*allow_stop=*/false));
    if (masked < n) parts.push_back(token_distribution(logits.narrow(0, masked, n - masked), o_, true));
    for (const at::Tensor& p : parts)
      if (!p.defined())
        throw NonFiniteLogits("speculative decoding: " + what + " logits are NaN or infinite at new tokens " +
                              std::to_string(first + 1) + " to " + std::to_string(first + n));
    return parts.size() == 1 ? parts[0] : at::cat(parts);
  }

  // Appends a kept token; false when the sample ends (the stop token, which
  // is not kept, or max_tokens reached).
  bool keep(int64_t token) {
    if (o_.stop_token >= 0 && token == o_.stop_token) return false;
    out_.push_back(static_cast<int32_t>(token));
    ctx_.push_back(token);
    return ssize(out_) < o_.max_tokens;
  }

  // One forward of the main model over the tokens not yet cached and the
  // pending drafts, then the acceptance rule (sampling/speculative_rule.h).
  // False when the sample ended.
  bool verify() {
    const int64_t J = ssize(ctx_), m = ssize(drafts_);
    const int64_t start = o_.use_cache ? ws_ + cache_.length : ws_;
    std::vector<int64_t> input(ctx_.begin() + start, ctx_.end());
    input.insert(input.end(), drafts_.begin(), drafts_.end());
    const at::Tensor h =
        model_.forward_layers(model_.embed(row(input, device_)), nullptr, o_.use_cache ? &cache_ : nullptr);
    hidden_ = o_.use_cache && hidden_.defined() ? at::cat({hidden_, h}, 1) : h;
    ++st_.forwards;
    st_.drafted += m;
    // p at ctx's last token (for the first draft) and at each draft.
    const at::Tensor logits = model_.logits(hidden_.narrow(1, J - 1 - ws_, m + 1))[0];
    const DraftVerdict v = verify_drafts(distributions(logits, ssize(out_), "the model's"), q_, drafts_, gen_);
    for (int64_t i = 0; i < v.accepted; ++i) {
      ++st_.accepted;
      if (!keep(drafts_[static_cast<size_t>(i)])) return false;
    }
    if (!keep(v.next)) return false;
    // Positions up to the last kept draft stay; the rejected drafts' go.
    const int64_t kept = J + v.accepted - ws_;
    hidden_ = hidden_.narrow(1, 0, kept);
    if (o_.use_cache) cache_.truncate(kept);
    drafts_.clear();
    return true;
  }

  // The MTP chain drafts the tokens after ctx's last, each drawn from its
  // module's distribution (masked as p would be at that new token), fed to
  // the next module. Without the cache the chain runs over the window. With
  // it each module keeps its own keys (mtp_cache_, one layer per module, one
  // length for all): module k reads at position i the token k + 1 after i, so
  // its last k positions read drafts, which change every round; the caches
  // keep only the positions where every module read kept tokens and each
  // round runs the chain over those after them (D + accepted a module).
  void draft() {
    const int64_t J = ssize(ctx_);
    // No draft past max_tokens or past the window plain sampling gives the
    // tokens (J + m - ws_ <= T).
    const int64_t m = std::min({ssize(mtp_), o_.max_tokens - ssize(out_), T_ - (J - ws_)});
    if (m <= 0) return;
    const int64_t n = J - 1 - ws_;  // positions with the main model's hidden states
    const int64_t from = o_.use_cache ? mtp_cache_.length : 0;  // positions the modules have cached
    MT_ASSERT(n >= 1 && hidden_.size(1) == n && from < n, "speculative decoding: ", hidden_.size(1),
              " hidden states for ", n, " positions, ", from, " of them in the modules' caches");
    if (o_.use_cache && mtp_cache_.layers.empty()) mtp_cache_.layers.resize(mtp_.size());
    std::vector<int64_t> ext(ctx_.begin() + ws_, ctx_.end());
    at::Tensor h = hidden_.narrow(1, from, n - from);
    std::vector<at::Tensor> q;
    for (int64_t k = 0; k < m; ++k) {
      MtpModule& module = *mtp_[static_cast<size_t>(k)];
      // Module k + 1 reads, at position i, h^k_i and the token k + 1 after i.
      const std::vector<int64_t> shifted(ext.begin() + from + k + 1, ext.begin() + k + 1 + n);
      const at::Tensor emb = model_.embedding()->forward(row(shifted, device_));
      h = o_.use_cache ? module.forward(h, emb, mtp_cache_.layers[static_cast<size_t>(k)], from)
                       : module.forward(h, emb, nullptr, nullptr);
      const at::Tensor logits = model_.head()->logits(module.head_norm(h.narrow(1, n - from - 1, 1)));
      q.push_back(distributions(logits[0], ssize(out_) + k, "multi-token prediction module " + std::to_string(k) +
                                                                "'s")[0]);
      drafts_.push_back(draw(q.back(), gen_));
      ext.push_back(drafts_.back());
    }
    q_ = at::stack(q);
    if (o_.use_cache) {
      // Module k's positions from n - k on read drafts. Modules not run this
      // round (m < D: near max_tokens or the window's end) hold only `from`.
      mtp_cache_.length = n;
      mtp_cache_.truncate(m == ssize(mtp_) ? n - (m - 1) : from);
    }
  }

  Transformer& model_;
  const std::vector<MtpModule*>& mtp_;
  const SampleOptions& o_;
  at::Generator& gen_;
  SpeculativeStats& st_;
  const int64_t T_;
  const at::Device device_;
  std::vector<int64_t> ctx_;     // prompt + kept tokens
  std::vector<int32_t> out_;     // kept tokens
  std::vector<int64_t> drafts_;  // pending, verified by the next forward
  at::Tensor q_;                 // [drafts, V'] the distributions they were drawn from
  int64_t ws_ = 0;               // the window's first token in ctx_
  KVCache cache_;                // the main model's keys at positions ws_.. (use_cache)
  KVCache mtp_cache_;            // the MTP modules' keys there, one layer per module (use_cache)
  at::Tensor hidden_;            // [1, t, d] its last layer's output there
};

}  // namespace

std::vector<std::vector<int32_t>> generate_speculative(Transformer& model,
                                                       const std::vector<std::vector<int32_t>>& prompts,
                                                       const SampleOptions& options, SpeculativeStats* stats) {
  MT_CHECK(model.mtp_depth() >= 1, "speculative decoding (inference_config.speculative) drafts with the "
           "multi-token prediction modules: model_config.mtp_depth must be >= 1");
  MT_CHECK(model.range().has_embedding && model.range().has_head, "speculative decoding "
           "(inference_config.speculative) needs the whole model on one stage");
  MT_CHECK(options.max_tokens >= 0, "max_tokens must be >= 0, got ", options.max_tokens);
  MT_CHECK(options.top_k >= 0, "top_k must be >= 0, got ", options.top_k);
  const int64_t V = model.config().vocab_size;
  for (const auto& p : prompts) {
    MT_CHECK(!p.empty(), "speculative decoding: empty prompt (hint: start it with at least one token)");
    for (int32_t t : p)
      MT_CHECK(t >= 0 && t < V, "speculative decoding: prompt token ", t, " outside the vocabulary [0, ", V, ")");
  }
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const std::vector<MtpModule*> mtp = mtp_modules(model);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  SpeculativeStats st;
  std::vector<std::vector<int32_t>> out;
  try {
    for (const auto& p : prompts) out.push_back(Decoder(model, mtp, options, gen, st).run(p));
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  if (stats) *stats = st;
  return out;
}

}  // namespace meshtrain
