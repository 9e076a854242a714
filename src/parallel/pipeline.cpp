#include "meshtrain/parallel/pipeline.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/grad_buckets.h"
#include "meshtrain/parallel/schedules.h"

namespace meshtrain {

namespace {

// pp == 1: each microbatch runs forward and backward in turn.
RoundSums run_single_stage(ParallelModel& pm, const Config& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                           const RoundSpec& spec) {
  RoundSums sums;
  const std::vector<Microbatch> mbs = split_microbatches(cfg, inputs, targets);
  for (const auto& mb : mbs) {
    ForwardAux aux;
    at::Tensor h = pm.model->forward_layers(pm.model->embed(mb.inputs), &aux);
    at::Tensor losses = pm.model->token_losses(h, mb.targets);
    accumulate_losses(sums, losses);
    accumulate_aux(sums, aux, mb.inputs.size(0));
    if (spec.backward && spec.final_round && pm.grad_buckets && &mb == &mbs.back()) pm.grad_buckets->arm(0);
    if (spec.backward) run_backward(spec, {stage_loss(losses, aux, mb.inputs.size(0), spec)}, {});
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
