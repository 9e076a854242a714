#include "meshtrain/parallel/pipeline.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/context_parallel.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/schedules.h"

namespace meshtrain {

namespace {

// pp == 1: each microbatch runs forward and backward in turn.
RoundSums run_single_stage(ParallelModel& pm, const std::vector<Microbatch>& mbs, const RoundSpec& spec) {
  RoundSums sums;
  for (const auto& mb : mbs) {
    ForwardAux aux;
    at::Tensor h = pm.model->forward_layers(pm.model->embed(mb.inputs), &aux, nullptr, mb.layout.get());
    at::Tensor losses = pm.model->token_losses(h, mb.targets);
    // Multi-token prediction: trained, and reported by evaluation.
    std::vector<at::Tensor> mtp;
    if (!mb.mtp.empty()) mtp = pm.model->mtp_token_losses(h, mb.mtp, &aux, mb.layout.get());
    accumulate_losses(sums, losses);
    accumulate_mtp(sums, mtp);
    accumulate_aux(sums, aux, mb.inputs.size(0));
    if (spec.backward && spec.final_round && pm.data_parallel && &mb == &mbs.back()) pm.data_parallel->arm(0);
    if (spec.backward) run_backward(spec, {stage_loss(losses, aux, mb.inputs.size(0), spec, mtp)}, {});
    sums.peak_live_microbatches = std::max<int64_t>(sums.peak_live_microbatches, 1);
  }
  return sums;
}

}  // namespace

RoundSums run_round(ParallelModel& pm, Mesh& mesh, const Config& cfg, const at::Tensor& inputs,
                    const at::Tensor& targets, const RoundSpec& spec, const at::Tensor& host_inputs) {
  std::optional<at::NoGradGuard> no_grad;
  if (!spec.backward) no_grad.emplace();
  // Token layouts are built on the host from the same split rows, once.
  const bool layouts = uses_token_layouts(cfg, mesh);
  const at::Tensor host = !layouts ? at::Tensor() : host_inputs.defined() ? host_inputs : inputs.cpu();
  std::vector<Microbatch> mbs = split_microbatches(cfg, inputs, targets, host);
  add_mtp_targets(mbs, cfg);
  if (layouts) lay_out_tokens(mbs, cfg, mesh);
  if (mesh.shape().pp == 1) return run_single_stage(pm, mbs, spec);
  return run_pipeline(pm, mesh, cfg, std::move(mbs), spec);
}

}  // namespace meshtrain
