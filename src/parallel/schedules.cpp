// Runs a pipeline plan (pipeline_plan.h) on this stage: activations go to
// the next virtual stage and gradients come back from it over mesh.pp(),
// whose rank is the stage index. Under the interleaved schedule the stage
// runs several chunks of layers and the last stage's chunk c feeds the first
// stage's chunk c + 1 (peers modulo pp); under zbv the V's turn is on the
// last stage, chunk 0 handing its output to chunk 1 (and chunk 1's input
// gradient back) in place, with no message.
//
// Zero-bubble plans split a backward in two: BackwardInput runs the
// backward with the layers' weight-gradient GEMMs queued (a WeightGradQueue
// per microbatch and chunk, model/mixed_matmul.h), BackwardWeight runs the
// queue. The gradient buckets are then never armed: a weight's hook fires in
// B before its product is added, so they all sum after the last W
// (GradBuckets::finish).
//
// On CUDA the transfers run on a side stream that first waits for the
// compute stream (an event), so a send never holds the compute stream until
// its peer posts the receive; the compute stream waits for a receive's event
// before it reads the data, and for the side stream at the round's end (the
// statistics and tied-embedding sums use the same communicator). Tensors the
// side stream touches are marked with record_stream. On CPU the same calls
// run in order.
#include "meshtrain/parallel/schedules.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <array>
#include <optional>

#include "meshtrain/core/check.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/pipeline_plan.h"
#include "wait_clock.h"

namespace meshtrain {

namespace {

constexpr int kActivationTag = 1;
constexpr int kGradientTag = 2;

// One microbatch's state in one chunk between its forward and its backward.
struct InFlight {
  at::Tensor input;   // received activation (but the first virtual stage), its grad goes back
  at::Tensor output;  // this chunk's hidden state (but the last virtual stage)
  at::Tensor loss;    // stage_loss (last virtual stage)
  at::Tensor aux;     // this chunk's weighted MoE aux terms (but the last virtual stage; undefined for dense)
  at::Tensor grad;    // gradient of output from stage + 1
};

class StageRunner {
 public:
  StageRunner(ParallelModel& pm, Mesh& mesh, const Config& cfg, const std::vector<Microbatch>& mbs,
              const RoundSpec& spec)
      : pm_(pm), comm_(mesh.pp()), mbs_(mbs), spec_(spec), stage_(mesh.coord().pp), pp_(mesh.shape().pp),
        chunks_(pm.model->n_chunks()), v_shape_(pm.model->range().v_shape),
        slots_(mbs.size() * static_cast<size_t>(chunks_)), weight_grads_(slots_.size()),
        clock_(pm.model->parameters().at(0).device()),
        pass_clocks_{WaitClock(clock_.device()), WaitClock(clock_.device()), WaitClock(clock_.device())} {
    // Each chunk's MoE statistics land after those of the stage's earlier chunks.
    int64_t moe = 0;
    for (const LayerSpan& c : pm.model->range().chunks()) {
      first_moe_.push_back(moe);
      for (int64_t i = c.first; i < c.end; ++i) moe += is_moe_layer(pm.model->config(), i) ? 1 : 0;
    }
    // Activations travel in the policy's dtype (bf16 under mixed precision),
    // never the fp32 master weights'.
    const at::Tensor p = pm.model->parameters().at(0);
    options_ = p.options().dtype(pm.model->precision().activation_dtype()).requires_grad(false);
    // Under sequence parallelism each tp rank carries its sequence shard
    // between stages, as it does between layers.
    const int64_t tp = mesh.shape().tp;
    seq_divisor_ = cfg.sequence_parallel && tp > 1 ? tp : 1;
    if (p.device().is_cuda()) side_ = c10::impl::VirtualGuardImpl(p.device().type()).getStreamFromGlobalPool(p.device());
  }

  void run(const std::vector<PipeOp>& plan) {
    // A chunk's last backward is where its gradients become final in the
    // step's last round (split backwards: see the top of the file).
    std::vector<size_t> last_backward(static_cast<size_t>(chunks_), plan.size());
    bool split = false;
    for (size_t i = 0; i < plan.size(); ++i) {
      MT_ASSERT(plan[i].chunk >= 0 && plan[i].chunk < chunks_, "plan step for chunk ", plan[i].chunk,
                " on a stage of ", chunks_);
      if (plan[i].step == PipeStep::Backward) last_backward[static_cast<size_t>(plan[i].chunk)] = i;
      split = split || plan[i].step == PipeStep::BackwardInput;
    }
    timed_passes_ = split;
    const bool arm = spec_.backward && spec_.final_round && pm_.data_parallel && !split;
    for (size_t i = 0; i < plan.size(); ++i) {
      const PipeOp& op = plan[i];
      if (arm && i == last_backward[static_cast<size_t>(op.chunk)]) pm_.data_parallel->arm(op.chunk);
      // A send next to a receive go as one send_recv (never a compute step,
      // so i + 1 is no backward to arm).
      if (i + 1 < plan.size() && paired_transfers(op, plan[i + 1])) {
        transfer_pair(op, plan[i + 1]);
        ++i;
        continue;
      }
      InFlight& s = slot(op);
      switch (op.step) {
        case PipeStep::RecvForward: recv_forward(s, op); break;
        case PipeStep::Forward: timed(0, [&] { forward(s, op.microbatch, op.chunk); }); break;
        case PipeStep::SendForward: send(s.output, peer(op), kActivationTag); if (!spec_.backward) s = {}; break;
        case PipeStep::RecvBackward: s.grad = at::empty_like(s.output); recv(s.grad, peer(op), kGradientTag); break;
        case PipeStep::Backward: backward(s, op); --live_; break;
        case PipeStep::SendBackward: send(s.input.grad(), peer(op), kGradientTag); s = {}; break;
        case PipeStep::BackwardInput: timed(1, [&] { backward_input(s, op); }); break;
        case PipeStep::BackwardWeight: timed(2, [&] { weight_grads(op).run(); }); --live_; break;
      }
    }
    for (const WeightGradQueue& q : weight_grads_)
      MT_ASSERT(q.size() == 0, "stage ", stage_, ": the plan left weight gradients queued (a B without its W)");
    // Outstanding sends finish before anything later on this communicator.
    if (side_) event_on(*side_).block(compute_stream());
  }

  RoundSums& sums() {
    // Read when the step is read (microbatch.h): the clock leaves with the sums.
    auto clock = std::make_shared<WaitClock>(std::move(clock_));
    sums_.waits.push_back([clock] { return clock->seconds(); });
    if (timed_passes_) {
      auto passes = std::make_shared<std::array<WaitClock, 3>>(std::move(pass_clocks_));
      sums_.passes.push_back([passes] {
        return std::array<double, 3>{(*passes)[0].seconds(), (*passes)[1].seconds(), (*passes)[2].seconds()};
      });
    }
    return sums_;
  }

 private:
  static bool is_send(PipeStep s) { return s == PipeStep::SendForward || s == PipeStep::SendBackward; }

  size_t slot_index(int64_t chunk, int64_t mb) const {
    return static_cast<size_t>(chunk) * mbs_.size() + static_cast<size_t>(mb);
  }
  InFlight& slot(const PipeOp& op) { return slots_.at(slot_index(op.chunk, op.microbatch)); }
  WeightGradQueue& weight_grads(const PipeOp& op) { return weight_grads_.at(slot_index(op.chunk, op.microbatch)); }

  // The virtual stages around this rank's chunk (data order) and where they
  // live: the interleaved layout or the V (pipeline_plan.h).
  int64_t virtual_stage(int64_t chunk) const { return virtual_stage_of(stage_, chunk, pp_, v_shape_); }
  bool first_virtual(int64_t chunk) const { return virtual_stage(chunk) == 0; }
  bool last_virtual(int64_t chunk) const { return virtual_stage(chunk) == pp_ * chunks_ - 1; }
  ChunkPlace neighbour(int64_t chunk, bool downstream) const {
    return place_of_virtual_stage(virtual_stage(chunk) + (downstream ? 1 : -1), pp_, chunks_, v_shape_);
  }
  // The rank a transfer step talks to.
  int peer(const PipeOp& op) const {
    const bool downstream = op.step == PipeStep::SendForward || op.step == PipeStep::RecvBackward;
    return neighbour(op.chunk, downstream).stage;
  }

  // Megatron's send_forward_recv_backward and the like: one send_recv, then
  // each half's bookkeeping as run() does it for the single steps.
  void transfer_pair(const PipeOp& a, const PipeOp& b) {
    const PipeOp& snd = is_send(a.step) ? a : b;
    const PipeOp& rcv = is_send(a.step) ? b : a;
    InFlight& ss = slot(snd);
    InFlight& rs = slot(rcv);
    const bool fwd_send = snd.step == PipeStep::SendForward, fwd_recv = rcv.step == PipeStep::RecvForward;
    const at::Tensor out = fwd_send ? ss.output : ss.input.grad();
    MT_ASSERT(out.defined(), "stage ", stage_, ": nothing to send to stage ", peer(snd));
    at::Tensor in = fwd_recv ? at::empty(hidden_shape(rcv.microbatch), options_) : at::empty_like(rs.output);
    on_side({out, in}, /*wait=*/true, [&] {
      clock_.begin();
      comm_.send_recv(out.detach().contiguous(), peer(snd), in, peer(rcv),
                      fwd_send ? kActivationTag : kGradientTag, fwd_recv ? kActivationTag : kGradientTag);
      clock_.end();
    });
    if (fwd_recv) {
      rs.input = in;
      if (spec_.backward) rs.input.requires_grad_(true);
    } else {
      rs.grad = in;
    }
    // As after a single send; the received slot is another one (its
    // microbatch or chunk differs whenever the sent slot is cleared).
    if (!fwd_send || !spec_.backward) {
      MT_ASSERT(&ss != &rs, "stage ", stage_, ": a paired transfer sends and receives one slot");
      ss = {};
    }
  }

  std::vector<int64_t> hidden_shape(int64_t mb) const {
    const at::Tensor& in = mbs_.at(static_cast<size_t>(mb)).inputs;
    return {in.size(0), in.size(1) / seq_divisor_, pm_.model->config().model_dimension};
  }

  void recv_forward(InFlight& s, const PipeOp& op) {
    s.input = at::empty(hidden_shape(op.microbatch), options_);
    recv(s.input, peer(op), kActivationTag);
    if (spec_.backward) s.input.requires_grad_(true);
  }

  void forward(InFlight& s, int64_t mb, int64_t chunk) {
    const Microbatch& m = mbs_.at(static_cast<size_t>(mb));
    const int64_t seqs = m.inputs.size(0);
    ForwardAux aux;
    at::Tensor h = pm_.model->forward_chunk(chunk, first_virtual(chunk) ? pm_.model->embed(m.inputs) : s.input, &aux,
                                            nullptr, m.layout.get());
    // Multi-token prediction (as run_single_stage): its modules' MoE losses
    // join this chunk's before they are counted.
    std::vector<at::Tensor> mtp;
    if (last_virtual(chunk) && !m.mtp.empty())
      mtp = pm_.model->mtp_token_losses(h, m.mtp, &aux, m.layout.get());
    accumulate_aux(sums_, aux, seqs, first_moe_[static_cast<size_t>(chunk)]);
    if (last_virtual(chunk)) {
      at::Tensor losses = pm_.model->token_losses(h, m.targets);
      accumulate_losses(sums_, losses);
      accumulate_mtp(sums_, mtp);
      if (spec_.backward) s.loss = stage_loss(losses, aux, seqs, spec_, mtp);
    } else {
      MT_ASSERT(h.sizes().vec() == hidden_shape(mb) && h.scalar_type() == options_.dtype(),
                "stage ", stage_, " produced ", h.sizes(), " ", h.scalar_type(), " but the next stage expects ",
                at::IntArrayRef(hidden_shape(mb)), " ", options_.dtype());
      s.output = h;
      // The weighted aux terms alone: stage_loss of no tokens.
      if (spec_.backward) s.aux = stage_loss(at::zeros({0}, options_), aux, seqs, spec_);
      const ChunkPlace next = neighbour(chunk, /*downstream=*/true);
      if (next.stage == stage_) {  // the V's turn: the next chunk reads it here, as if received
        InFlight& t = slots_.at(slot_index(next.chunk, mb));
        t.input = h.detach();
        if (spec_.backward) t.input.requires_grad_(true);
        else s = {};
      }
    }
    ++live_;
    sums_.peak_live_microbatches = std::max(sums_.peak_live_microbatches, live_);
    if (!spec_.backward) --live_;  // nothing is kept for a backward
  }

  // B: the backward with the weight-gradient GEMMs queued for the W step.
  void backward_input(InFlight& s, const PipeOp& op) {
    MixedPrecision& mp = pm_.model->precision();
    mp.defer_weight_grads(&weight_grads(op));
    try {
      backward(s, op);
    } catch (...) {
      mp.defer_weight_grads(nullptr);
      throw;
    }
    mp.defer_weight_grads(nullptr);
  }

  void backward(InFlight& s, const PipeOp& op) {
    const int64_t chunk = op.chunk;
    if (last_virtual(chunk)) {
      run_backward(spec_, {s.loss}, {});
    } else {
      // Two roots: the activation gradient from downstream, and this stage's
      // own MoE aux loss, which no later stage sees.
      std::vector<at::Tensor> roots = {s.output}, grads = {s.grad};
      if (s.aux.requires_grad()) {
        roots.push_back(s.aux);
        grads.push_back(at::ones_like(s.aux));
      }
      run_backward(spec_, roots, grads);
    }
    s.output = s.loss = s.aux = s.grad = at::Tensor();
    if (first_virtual(chunk)) return;
    const ChunkPlace prev = neighbour(chunk, /*downstream=*/false);
    if (prev.stage == stage_) {  // the V's turn, backward: chunk 0's output gradient, as if received
      slots_.at(slot_index(prev.chunk, op.microbatch)).grad = s.input.grad();
      s = {};
    }
  }

  void send(const at::Tensor& t, int dst, int tag) {
    MT_ASSERT(t.defined(), "stage ", stage_, ": nothing to send to stage ", dst);
    on_side({t}, /*wait=*/false, [&] {
      clock_.begin();
      comm_.send(t.detach().contiguous(), dst, tag);
      clock_.end();
    });
  }

  void recv(at::Tensor& t, int src, int tag) {
    on_side({t}, /*wait=*/true, [&] {
      clock_.begin();
      comm_.recv(t, src, tag);
      clock_.end();
    });
  }

  c10::Stream compute_stream() const {
    return c10::impl::VirtualGuardImpl(side_->device_type()).getStream(side_->device());
  }
  static c10::Event event_on(const c10::Stream& s) {
    c10::Event e(s.device_type());
    e.record(s);
    return e;
  }

  // Runs a transfer on the side stream (CUDA) after the compute stream's
  // work so far; `wait`: the compute stream waits for it (a receive, read
  // next). CPU: f() in place.
  template <class F>
  void on_side(std::initializer_list<at::Tensor> used, bool wait, F&& f) {
    if (!side_) return f();
    event_on(compute_stream()).block(*side_);
    {
      c10::StreamGuard guard(*side_);
      f();
    }
    // Made on the compute stream, used on the side one: kept until it is done.
    for (const at::Tensor& t : used) t.record_stream(*side_);
    if (wait) event_on(*side_).block(compute_stream());
  }

  ParallelModel& pm_;
  Communicator& comm_;
  const std::vector<Microbatch>& mbs_;
  const RoundSpec& spec_;
  const int stage_, pp_;
  const int64_t chunks_;
  const bool v_shape_;
  std::vector<int64_t> first_moe_;  // per chunk: MoE layers in the stage's earlier chunks
  std::vector<InFlight> slots_;
  std::vector<WeightGradQueue> weight_grads_;  // per slot: a B's deferred products until its W
  at::TensorOptions options_;
  int64_t seq_divisor_ = 1;
  int64_t live_ = 0;
  WaitClock clock_;  // time blocked on a neighbour (the bubble metric)
  // Split plans: time in forward, B and W passes (RoundSums::passes).
  std::array<WaitClock, 3> pass_clocks_;
  bool timed_passes_ = false;

  template <class F>
  void timed(size_t pass, F&& f) {
    if (!timed_passes_) return f();
    pass_clocks_[pass].begin();
    f();
    pass_clocks_[pass].end();
  }
  RoundSums sums_;
  std::optional<c10::Stream> side_;  // CUDA: where the transfers run
};

}  // namespace

RoundSums run_pipeline(ParallelModel& pm, Mesh& mesh, const Config& cfg, const std::vector<Microbatch>& mbs,
                       const RoundSpec& spec) {
  // Every rank derives the same plan from the same config, so a bad schedule
  // or microbatch count throws everywhere before any message is sent.
  const auto plan = pipeline_plan(cfg.pipeline_schedule, mesh.coord().pp, mesh.shape().pp,
                                  static_cast<int64_t>(mbs.size()), spec.backward, pm.model->n_chunks(),
                                  pipeline_pass_costs(cfg));
  StageRunner runner(pm, mesh, cfg, mbs, spec);
  runner.run(plan);
  return std::move(runner.sums());
}

}  // namespace meshtrain
