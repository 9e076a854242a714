// Runs a pipeline plan (pipeline_plan.h) on this stage: activations go to
// stage + 1 and gradients come back from it over mesh.pp(), whose rank is the
// stage index.
#include "meshtrain/parallel/schedules.h"

#include <torch/torch.h>

#include <chrono>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/pipeline_plan.h"

namespace meshtrain {

namespace {

constexpr int kActivationTag = 1;
constexpr int kGradientTag = 2;

// One microbatch's state between its forward and its backward on this stage.
struct InFlight {
  at::Tensor input;   // received activation (non-first stages), its grad goes back
  at::Tensor output;  // this stage's hidden state (non-last stages)
  at::Tensor loss;    // stage_loss (last stage)
  at::Tensor aux;     // this stage's weighted MoE aux terms (non-last stages; undefined for dense)
  at::Tensor grad;    // gradient of output from stage + 1
};

class StageRunner {
 public:
  StageRunner(ParallelModel& pm, Mesh& mesh, const Config& cfg, const std::vector<Microbatch>& mbs,
              const RoundSpec& spec)
      : pm_(pm), comm_(mesh.pp()), mbs_(mbs), spec_(spec), stage_(mesh.coord().pp),
        last_(mesh.is_last_stage()), slots_(mbs.size()) {
    const at::Tensor p = pm.model->parameters().at(0);
    options_ = p.options().requires_grad(false);
    // Under sequence parallelism each tp rank carries its sequence shard
    // between stages, as it does between layers.
    const int64_t tp = mesh.shape().tp;
    seq_divisor_ = cfg.sequence_parallel && tp > 1 ? tp : 1;
  }

  void run(const std::vector<PipeOp>& plan) {
    for (const auto& op : plan) {
      auto& s = slots_.at(static_cast<size_t>(op.microbatch));
      switch (op.step) {
        case PipeStep::RecvForward: recv_forward(s, op.microbatch); break;
        case PipeStep::Forward: forward(s, op.microbatch); break;
        case PipeStep::SendForward: send(s.output, stage_ + 1, kActivationTag); if (!spec_.backward) s = {}; break;
        case PipeStep::RecvBackward: s.grad = at::empty_like(s.output); recv(s.grad, stage_ + 1, kGradientTag); break;
        case PipeStep::Backward: backward(s); break;
        case PipeStep::SendBackward: send(s.input.grad(), stage_ - 1, kGradientTag); s = {}; break;
      }
    }
  }

  RoundSums& sums() { return sums_; }

 private:
  std::vector<int64_t> hidden_shape(int64_t mb) const {
    const at::Tensor& in = mbs_.at(static_cast<size_t>(mb)).inputs;
    return {in.size(0), in.size(1) / seq_divisor_, pm_.model->config().model_dimension};
  }

  void recv_forward(InFlight& s, int64_t mb) {
    s.input = at::empty(hidden_shape(mb), options_);
    recv(s.input, stage_ - 1, kActivationTag);
    if (spec_.backward) s.input.requires_grad_(true);
  }

  void forward(InFlight& s, int64_t mb) {
    const Microbatch& m = mbs_.at(static_cast<size_t>(mb));
    const int64_t seqs = m.inputs.size(0);
    ForwardAux aux;
    at::Tensor h = pm_.model->forward_layers(stage_ == 0 ? pm_.model->embed(m.inputs) : s.input, &aux);
    accumulate_aux(sums_, aux, seqs);
    if (last_) {
      at::Tensor losses = pm_.model->token_losses(h, m.targets);
      accumulate_losses(sums_, losses);
      if (spec_.backward) s.loss = stage_loss(losses, aux, seqs, spec_);
    } else {
      MT_ASSERT(h.sizes().vec() == hidden_shape(mb) && h.scalar_type() == options_.dtype(),
                "stage ", stage_, " produced ", h.sizes(), " ", h.scalar_type(), " but the next stage expects ",
                at::IntArrayRef(hidden_shape(mb)), " ", options_.dtype());
      s.output = h;
      // The weighted aux terms alone: stage_loss of no tokens.
      if (spec_.backward) s.aux = stage_loss(at::zeros({0}, options_), aux, seqs, spec_);
    }
    ++live_;
    sums_.peak_live_microbatches = std::max(sums_.peak_live_microbatches, live_);
    if (!spec_.backward) --live_;  // nothing is kept for a backward
  }

  void backward(InFlight& s) {
    if (last_) {
      s.loss.backward();
    } else {
      // Two roots: the activation gradient from downstream, and this stage's
      // own MoE aux loss, which no later stage sees.
      std::vector<at::Tensor> roots = {s.output}, grads = {s.grad};
      if (s.aux.requires_grad()) {
        roots.push_back(s.aux);
        grads.push_back(at::ones_like(s.aux));
      }
      torch::autograd::backward(roots, grads);
    }
    s.output = s.loss = s.aux = s.grad = at::Tensor();
    --live_;
  }

  void send(const at::Tensor& t, int dst, int tag) {
    MT_ASSERT(t.defined(), "stage ", stage_, ": nothing to send to stage ", dst);
    const auto t0 = std::chrono::steady_clock::now();
    comm_.send(t.detach().contiguous(), dst, tag);
    sums_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void recv(at::Tensor& t, int src, int tag) {
    const auto t0 = std::chrono::steady_clock::now();
    comm_.recv(t, src, tag);
    sums_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  ParallelModel& pm_;
  Communicator& comm_;
  const std::vector<Microbatch>& mbs_;
  const RoundSpec& spec_;
  const int stage_;
  const bool last_;
  std::vector<InFlight> slots_;
  at::TensorOptions options_;
  int64_t seq_divisor_ = 1;
  int64_t live_ = 0;
  RoundSums sums_;
};

}  // namespace

RoundSums run_pipeline(ParallelModel& pm, Mesh& mesh, const Config& cfg, const std::vector<Microbatch>& mbs,
                       const RoundSpec& spec) {
  // Every rank derives the same plan from the same config, so a bad schedule
  // or microbatch count throws everywhere before any message is sent.
  const auto plan = pipeline_plan(cfg.pipeline_schedule, mesh.coord().pp, mesh.shape().pp,
                                  static_cast<int64_t>(mbs.size()), spec.backward);
  StageRunner runner(pm, mesh, cfg, mbs, spec);
  runner.run(plan);
  return std::move(runner.sums());
}

}  // namespace meshtrain
