#include "meshtrain/parallel/pipeline_plan.h"

#include <torch/torch.h>

#include <algorithm>

#include "interleaved_plan.h"
#include "meshtrain/core/check.h"
#include "meshtrain/model/flops.h"

namespace meshtrain {

namespace {

// Appends steps, dropping the transfers the first/last stage has no peer for.
struct PlanBuilder {
  bool first, last;
  std::vector<PipeOp> ops;
  void add(PipeStep s, int64_t mb) {
    if (first && (s == PipeStep::RecvForward || s == PipeStep::SendBackward)) return;
    if (last && (s == PipeStep::SendForward || s == PipeStep::RecvBackward)) return;
    ops.push_back({s, mb});
  }
  void forward(int64_t mb) {
    add(PipeStep::RecvForward, mb);
    add(PipeStep::Forward, mb);
    add(PipeStep::SendForward, mb);
  }
  void backward(int64_t mb) {
    add(PipeStep::RecvBackward, mb);
    add(PipeStep::Backward, mb);
    add(PipeStep::SendBackward, mb);
  }
};

// Megatron-Core's forward_backward_pipelining_without_interleaving with its
// paired transfers made sequential. Within a pair the two neighbours must
// agree on the order of the same two messages: send_forward_recv_backward
// (towards stage + 1) sends first, send_backward_recv_forward (towards
// stage - 1) receives first, so stage s's "send activation k" meets stage
// s+1's "receive activation k" and both then swap the gradient. A stage
// blocked in a pair waits only on stages after it, and the last stage never
// waits on anyone downstream, so every chain of waits ends.
void one_f_one_b(PlanBuilder& b, int stage, int pp, int64_t n_mb) {
  const int64_t warmup = std::min<int64_t>(pp - stage - 1, n_mb);
  const int64_t steady = n_mb - warmup;
  for (int64_t i = 0; i < warmup; ++i) b.forward(i);
  if (steady > 0) b.add(PipeStep::RecvForward, warmup);
  for (int64_t i = 0; i < steady; ++i) {
    b.add(PipeStep::Forward, warmup + i);
    b.add(PipeStep::SendForward, warmup + i);
    b.add(PipeStep::RecvBackward, i);
    b.add(PipeStep::Backward, i);
    if (i + 1 < steady) b.add(PipeStep::RecvForward, warmup + i + 1);
    b.add(PipeStep::SendBackward, i);
  }
  for (int64_t i = steady; i < n_mb; ++i) b.backward(i);
}

}  // namespace

PassCosts pipeline_pass_costs(const Config& cfg) {
  const std::vector<double>& set = cfg.pipeline_pass_costs;
  if (!set.empty()) {
    MT_CHECK(set.size() == 3, "pipeline_pass_costs must be [forward, B, W], got ", set.size(), " numbers");
    return {set[0], set[1], set[2]};
  }
  const PassCostRatios r = pass_cost_ratios(cfg.model);
  const double recompute = cfg.activation_checkpointing == ActivationCheckpointing::Full ? 1.0 : 0.0;
  return {1.0, r.backward_input + recompute, r.backward_weight};
}

std::vector<PipeOp> pipeline_plan(PipelineSchedule schedule, int stage, int pp, int64_t n_mb, bool backward,
                                  int64_t v, const PassCosts& costs) {
  const bool interleaved = schedule == PipelineSchedule::Interleaved;
  MT_CHECK(pp >= 1 && stage >= 0 && stage < pp, "pipeline stage ", stage, " is outside 0..", pp - 1);
  MT_CHECK(n_mb >= 1, "a pipeline round needs at least one microbatch, got ", n_mb);
  if (schedule == PipelineSchedule::ZbH1 || schedule == PipelineSchedule::Zbv) {
    const bool v_shape = schedule == PipelineSchedule::Zbv;
    MT_CHECK(v == (v_shape ? 2 : 1) || (v == 0 && !v_shape), "pipeline_schedule \"", schedule, "\" runs ",
             v_shape ? 2 : 1, " layer chunk(s) a stage, got virtual_stages ", v);
    return zero_bubble_plans(v_shape ? ZeroBubble::V : ZeroBubble::H1, pp, n_mb, backward, costs)
        .at(static_cast<size_t>(stage));
  }
  if (v == 0 && !interleaved) v = 1;
  MT_CHECK(v >= 1, "virtual_stages must be >= 1 for pipeline_schedule \"", schedule, "\", got ", v);
  MT_CHECK(v == 1 || interleaved, "virtual_stages=", v, " needs pipeline_schedule \"interleaved\", not \"",
           schedule, "\"");
  if (v > 1) {
    // Megatron's condition: its order sends groups of pp microbatches
    // through each chunk (forward-only rounds take any count).
    MT_CHECK(!backward || n_mb % pp == 0, "pipeline_schedule \"interleaved\" (virtual_stages=", v,
             ") needs the microbatches per round (", n_mb,
             ": the per-dp-rank batch / data_config.micro_batch_size) to be a multiple of pp = ", pp);
    return interleaved_plans(pp, v, n_mb, backward).at(static_cast<size_t>(stage));
  }
  PlanBuilder b{stage == 0, stage == pp - 1, {}};
  if (!backward) {
    for (int64_t i = 0; i < n_mb; ++i) b.forward(i);
  } else if (schedule == PipelineSchedule::Gpipe) {
    for (int64_t i = 0; i < n_mb; ++i) b.forward(i);
    for (int64_t i = 0; i < n_mb; ++i) b.backward(i);
  } else {
    one_f_one_b(b, stage, pp, n_mb);  // interleaved with one chunk per stage is 1f1b
  }
  return b.ops;
}

double pipeline_bubble_fraction(int pp, int64_t n_mb, int64_t v) {
  MT_CHECK(pp >= 1 && n_mb >= 1 && v >= 1, "pipeline bubble of pp ", pp, ", ", n_mb, " microbatches, ", v,
           " virtual stages");
  return static_cast<double>(pp - 1) / static_cast<double>(v * n_mb + pp - 1);
}

int64_t plan_peak_live(const std::vector<PipeOp>& plan) {
  // A split backward's microbatch lives until its W: B leaves the weight
  // gradients' operands (layer inputs and output gradients) queued for it.
  const auto ends = [](PipeStep s) { return s == PipeStep::Backward || s == PipeStep::BackwardWeight; };
  const bool has_backward = std::any_of(plan.begin(), plan.end(), [&](const PipeOp& o) { return ends(o.step); });
  int64_t live = 0, peak = 0;
  for (const auto& o : plan) {
    if (o.step == PipeStep::Forward) peak = std::max(peak, ++live);
    if (ends(o.step) || (!has_backward && o.step == PipeStep::Forward)) --live;
  }
  return peak;
}

bool paired_transfers(const PipeOp& a, const PipeOp& b) {
  const auto send = [](PipeStep s) { return s == PipeStep::SendForward || s == PipeStep::SendBackward; };
  const auto recv = [](PipeStep s) { return s == PipeStep::RecvForward || s == PipeStep::RecvBackward; };
  return (send(a.step) && recv(b.step)) || (recv(a.step) && send(b.step));
}

const char* step_name(PipeStep s) {
  switch (s) {
    case PipeStep::RecvForward: return "recv_forward";
    case PipeStep::Forward: return "forward";
    case PipeStep::SendForward: return "send_forward";
    case PipeStep::RecvBackward: return "recv_backward";
    case PipeStep::Backward: return "backward";
    case PipeStep::SendBackward: return "send_backward";
    case PipeStep::BackwardInput: return "backward_input";
    case PipeStep::BackwardWeight: return "backward_weight";
  }
  return "?";
}

}  // namespace meshtrain
