// Greedy self-speculative decoding with the MTP modules (see speculative.h).
#include "meshtrain/sampling/speculative.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/model/mtp.h"

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

// The greedy token from logits [V]: the stop token left out while !allow_stop.
int64_t greedy(at::Tensor logits, const SampleOptions& o, bool allow_stop) {
  logits = logits.to(at::kCPU, at::kFloat);
  if (o.vocab_limit > 0 && o.vocab_limit < logits.size(0)) logits = logits.narrow(0, 0, o.vocab_limit);
  if (!at::isfinite(logits).all().item<bool>()) throw NonFiniteLogits("speculative decoding: non-finite logits");
  if (!allow_stop && o.stop_token >= 0 && o.stop_token < logits.size(0)) {
    logits = logits.clone();
    logits[o.stop_token] = -std::numeric_limits<float>::infinity();
  }
  return logits.argmax().item<int64_t>();
}

at::Tensor row(const std::vector<int64_t>& ids, const at::Device& device) {
  return at::tensor(ids, at::TensorOptions().dtype(at::kLong)).view({1, -1}).to(device);
}

// The MTP chain on hidden states h [1, n, d] of tokens ext[0..n) with ext[n]
// the token after them: drafts of the D tokens after ext[n].
std::vector<int64_t> draft(Transformer& model, const std::vector<MtpModule*>& mtp, at::Tensor h,
                           std::vector<int64_t> ext, const SampleOptions& o, const at::Device& device) {
  const auto n = static_cast<int64_t>(h.size(1));
  std::vector<int64_t> out;
  for (size_t k = 0; k < mtp.size(); ++k) {
    const std::vector<int64_t> shifted(ext.begin() + static_cast<std::ptrdiff_t>(k) + 1,
                                       ext.begin() + static_cast<std::ptrdiff_t>(k) + 1 + n);
    h = mtp[k]->forward(h, model.embedding()->forward(row(shifted, device)), nullptr, nullptr);
    const int64_t d = greedy(model.head()->logits(mtp[k]->head_norm(h.narrow(1, n - 1, 1)))[0][0], o, true);
    out.push_back(d);
    ext.push_back(d);
  }
  return out;
}

std::vector<int32_t> continue_one(Transformer& model, const std::vector<MtpModule*>& mtp,
                                  const std::vector<int32_t>& prompt, const SampleOptions& o, SpeculativeStats& st) {
  const auto T = static_cast<size_t>(model.config().T);
  const at::Device device = model.parameters().front().device();
  std::vector<int64_t> ctx(prompt.begin(), prompt.end()), drafts;
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < o.max_tokens) {
    if (o.check_stop) o.check_stop();
    if (ctx.size() + drafts.size() > T) drafts.clear();  // verified on the context plain greedy sees
    std::vector<int64_t> seq = ctx;
    seq.insert(seq.end(), drafts.begin(), drafts.end());
    const size_t cut = seq.size() - std::min(seq.size(), T);
    const std::vector<int64_t> window(seq.begin() + static_cast<std::ptrdiff_t>(cut), seq.end());
    const at::Tensor h = model.forward_layers(model.embed(row(window, device)), nullptr);
    const at::Tensor logits = model.logits(h)[0];  // [window, V]
    ++st.forwards;
    st.drafted += static_cast<int64_t>(drafts.size());
    // The main model's token after ctx + drafts[0..a), while it equals the next draft.
    const size_t base = ctx.size();
    size_t a = 0;
    int64_t next = 0;
    bool stop = false;
    for (;; ++a) {
      const size_t pos = base + a - 1 - cut;
      const bool allow_stop = static_cast<int64_t>(out.size()) >= o.min_tokens;
      next = greedy(logits[static_cast<int64_t>(pos)], o, allow_stop);
      stop = o.stop_token >= 0 && next == o.stop_token;
      if (stop || a == drafts.size() || next != drafts[a]) break;
      out.push_back(static_cast<int32_t>(next));
      ctx.push_back(next);
      ++st.accepted;
      if (static_cast<int64_t>(out.size()) == o.max_tokens) return out;
    }
    if (stop) break;
    out.push_back(static_cast<int32_t>(next));
    ctx.push_back(next);
    drafts.clear();
    const size_t room = static_cast<size_t>(o.max_tokens) - out.size();
    if (mtp.empty() || room == 0 || ctx.size() > T) continue;
    // Hidden states of the verified tokens (the window up to the one before next).
    const auto n = static_cast<int64_t>(ctx.size() - 1 - cut);
    std::vector<int64_t> ext(ctx.begin() + static_cast<std::ptrdiff_t>(cut), ctx.end());
    drafts = draft(model, mtp, h.narrow(1, 0, n), ext, o, device);
    if (drafts.size() > room) drafts.resize(room);
  }
  return out;
}

}  // namespace

std::vector<std::vector<int32_t>> generate_speculative(Transformer& model,
                                                       const std::vector<std::vector<int32_t>>& prompts,
                                                       const SampleOptions& options, SpeculativeStats* stats) {
  MT_CHECK(options.temperature <= 0.0, "inference_config.speculative is greedy for now: it needs "
           "inference_config.temperature 0 (generate --temperature 0), got ", options.temperature);
  MT_CHECK(model.mtp_depth() >= 1, "speculative decoding drafts with the multi-token prediction modules: "
           "model_config.mtp_depth must be >= 1");
  MT_CHECK(model.range().has_embedding && model.range().has_head, "speculative decoding needs the whole model "
           "on one stage");
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const std::vector<MtpModule*> mtp = mtp_modules(model);
  SpeculativeStats st;
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) {
    MT_CHECK(!p.empty(), "speculative decoding: a prompt is empty");
    out.push_back(continue_one(model, mtp, p, options, st));
  }
  model.train(was_training);
  if (stats) *stats = st;
  return out;
}

}  // namespace meshtrain
