#include "meshtrain/parallel/pipeline.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/schedules.h"

namespace meshtrain {

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
  if (sums.expert_tokens.size() < aux.expert_tokens.size()) sums.expert_tokens.resize(aux.expert_tokens.size());
  for (size_t l = 0; l < aux.expert_tokens.size(); ++l) {
    at::Tensor c = aux.expert_tokens[l].to(at::kDouble).cpu().contiguous();
    auto& dst = sums.expert_tokens[l];
    if (dst.empty()) dst.assign(static_cast<size_t>(c.numel()), 0.0);
    for (int64_t e = 0; e < c.numel(); ++e) dst[static_cast<size_t>(e)] += c.data_ptr<double>()[e];
  }
}

at::Tensor stage_loss(const at::Tensor& token_losses, const ForwardAux& aux, int64_t sequences, const RoundSpec& spec) {
  at::Tensor loss = token_losses.sum() * spec.ce_scale;
  const double seqs = static_cast<double>(sequences);
  if (aux.aux_loss.defined() && spec.aux_scale != 0.0) loss = loss + aux.aux_loss * (spec.aux_scale * seqs);
  if (aux.z_loss.defined() && spec.z_scale != 0.0) loss = loss + aux.z_loss * (spec.z_scale * seqs);
  return loss;
}

namespace {

// pp == 1: each microbatch runs forward and backward in turn.
RoundSums run_single_stage(ParallelModel& pm, const Config& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                           const RoundSpec& spec) {
  RoundSums sums;
  for (auto& mb : split_microbatches(cfg, inputs, targets)) {
    ForwardAux aux;
    at::Tensor h = pm.model->forward_layers(pm.model->embed(mb.inputs), &aux);
    at::Tensor losses = pm.model->token_losses(h, mb.targets);
    sums.ce_sum += losses.detach().sum().item<double>();
    sums.tokens += static_cast<double>(losses.numel());
    accumulate_aux(sums, aux, mb.inputs.size(0));
    if (spec.backward) stage_loss(losses, aux, mb.inputs.size(0), spec).backward();
    sums.peak_live_microbatches = std::max<int64_t>(sums.peak_live_microbatches, 1);
  }
  return sums;
}

}  // namespace

RoundSums run_round(ParallelModel& pm, Mesh& mesh, const Config& cfg, const at::Tensor& inputs,
                    const at::Tensor& targets, const RoundSpec& spec) {
  std::optional<at::NoGradGuard> no_grad;
  if (!spec.backward) no_grad.emplace();
  if (mesh.shape().pp == 1) return run_single_stage(pm, cfg, inputs, targets, spec);
  return run_pipeline(pm, mesh, cfg, split_microbatches(cfg, inputs, targets), spec);
}

}  // namespace meshtrain
