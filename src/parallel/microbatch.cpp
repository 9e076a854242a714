#include "meshtrain/parallel/microbatch.h"

#include <torch/torch.h>

#include <algorithm>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

// Adds src into dst, element by element, growing dst to src's shape.
void add_counts(std::vector<std::vector<double>>& dst, const std::vector<std::vector<double>>& src) {
  if (dst.size() < src.size()) dst.resize(src.size());
  for (size_t l = 0; l < src.size(); ++l) {
    auto& d = dst[l];
    if (d.size() < src[l].size()) d.resize(src[l].size(), 0.0);
    for (size_t e = 0; e < src[l].size(); ++e) d[e] += src[l][e];
  }
}

}  // namespace

RoundSums& RoundSums::operator+=(const RoundSums& o) {
  ce_sum += o.ce_sum;
  tokens += o.tokens;
  aux_sum += o.aux_sum;
  z_sum += o.z_sum;
  dropped += o.dropped;
  assigned += o.assigned;
  add_counts(expert_tokens, o.expert_tokens);
  peak_live_microbatches = std::max(peak_live_microbatches, o.peak_live_microbatches);
  wait_seconds += o.wait_seconds;
  return *this;
}

std::vector<Microbatch> split_microbatches(const Config& cfg, const at::Tensor& inputs, const at::Tensor& targets) {
  const int64_t b = inputs.size(0);
  const int64_t mb = cfg.data.micro_batch_size > 0 ? std::min<int64_t>(cfg.data.micro_batch_size, b) : b;
  MT_CHECK(b % mb == 0, "data_config.micro_batch_size=", mb, " must divide the per-dp-rank batch ", b);
  std::vector<Microbatch> out;
  for (int64_t s = 0; s < b; s += mb) out.push_back({inputs.narrow(0, s, mb), targets.narrow(0, s, mb)});
  return out;
}

void accumulate_aux(RoundSums& sums, const ForwardAux& aux, int64_t sequences) {
  if (aux.aux_loss.defined()) sums.aux_sum += aux.aux_loss.item<double>() * static_cast<double>(sequences);
  if (aux.z_loss.defined()) sums.z_sum += aux.z_loss.item<double>() * static_cast<double>(sequences);
  if (aux.dropped.defined()) sums.dropped += aux.dropped.item<double>();
  if (aux.assigned.defined()) sums.assigned += aux.assigned.item<double>();
  std::vector<std::vector<double>> counts;
  for (const auto& t : aux.expert_tokens) {
    at::Tensor c = t.to(at::kDouble).cpu().contiguous();
    counts.emplace_back(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  add_counts(sums.expert_tokens, counts);
}

at::Tensor stage_loss(const at::Tensor& token_losses, const ForwardAux& aux, int64_t sequences, const RoundSpec& spec) {
  at::Tensor loss = token_losses.sum() * spec.ce_scale;
  const double seqs = static_cast<double>(sequences);
  if (aux.aux_loss.defined() && spec.aux_scale != 0.0) loss = loss + aux.aux_loss * (spec.aux_scale * seqs);
  if (aux.z_loss.defined() && spec.z_scale != 0.0) loss = loss + aux.z_loss * (spec.z_scale * seqs);
  return loss;
}

}  // namespace meshtrain
