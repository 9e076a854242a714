// One optimizer step on a Session (see step.h).
#include "meshtrain/train/step.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/optim/rampup.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/pipeline.h"

namespace meshtrain {

namespace {

// This round's batch; following: the next round's size, read ahead.
Batch next_train_batch(Session& s, int64_t global_batch, int64_t following) {
  if (BatchPrefetcher* p = s.prefetcher()) return p->next(global_batch, following);
  // Meta: token values never matter, only the shape of this rank's share.
  const int64_t local = global_batch / s.mesh().shape().data_dp();
  const at::Tensor tokens = at::zeros({local, s.config().data.T}, at::kLong);
  return {tokens, tokens};
}

}  // namespace

StepStats reduce_stats(Session& s, const RoundSums& sums, double global_tokens, int64_t seq_len) {
  // ce lives on the last stage, aux on every stage; the expert counts of this
  // stage's MoE layers go to their global rows (layers this stage does not
  // own, or dense ones, stay zero), multi-token prediction module j's to row
  // n_layers + j (the last stage's).
  const Config& cfg = s.config();
  const int64_t n_layers = cfg.model.n_layers();
  const int64_t D = cfg.model.mtp_depth;
  const int64_t E = cfg.model.ffn == FfnKind::Moe ? cfg.model.n_experts : 0;
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(s.device());
  auto value = [&](const at::Tensor& t) { return t.defined() ? t.reshape({1}) : at::zeros({1}, opts); };
  StepStats st;
  st.sums.ce = value(sums.ce_sum);
  st.sums.aux = value(sums.aux_sum);
  st.sums.z = value(sums.z_sum);
  st.sums.dropped = value(sums.dropped);
  st.sums.assigned = value(sums.assigned);
  st.sums.expert_tokens = at::zeros({E > 0 ? n_layers + D : 0, E}, opts);
  st.sums.mtp = at::zeros({cfg.model.mtp_depth}, opts);
  for (size_t k = 0; k < sums.mtp_sum.size(); ++k)
    if (sums.mtp_sum[k].defined()) st.sums.mtp[static_cast<int64_t>(k)].copy_(sums.mtp_sum[k]);
  if (E > 0) {
    // expert_tokens has one entry per MoE layer of this stage, in order; with
    // moe_layers "last_in_block" those are not all of its layers.
    std::vector<int64_t> moe_layers;
    for (int64_t i : s.model().range.layers())
      if (is_moe_layer(cfg.model, i)) moe_layers.push_back(i);
    MT_ASSERT(sums.expert_tokens.size() <= moe_layers.size(), "expert counts for ", sums.expert_tokens.size(),
              " layers but the stage has ", moe_layers.size(), " MoE layers");
    for (size_t l = 0; l < sums.expert_tokens.size(); ++l)
      if (sums.expert_tokens[l].defined()) st.sums.expert_tokens[moe_layers[l]].copy_(sums.expert_tokens[l]);
    MT_ASSERT(static_cast<int64_t>(sums.mtp_expert_tokens.size()) <= D, "expert counts for ",
              sums.mtp_expert_tokens.size(), " multi-token prediction modules but mtp_depth is ", D);
    for (size_t j = 0; j < sums.mtp_expert_tokens.size(); ++j)
      if (sums.mtp_expert_tokens[j].defined())
        st.sums.expert_tokens[n_layers + static_cast<int64_t>(j)].copy_(sums.mtp_expert_tokens[j]);
  }
  // One sum over dp and pp, packed: tp ranks hold the same statistics. Their
  // communicators move device tensors (NCCL on GPU), so the statistics never
  // leave the device, and the tp traffic stays the model's.
  std::vector<at::Tensor> flat;
  for (at::Tensor* f : st.sums.fields()) flat.push_back(f->flatten());
  at::Tensor packed = at::cat(flat);
  for (Communicator* c : {&s.mesh().dp(), &s.mesh().pp()})
    if (c->size() > 1) c->all_reduce(packed);
  int64_t offset = 0;
  for (at::Tensor* f : st.sums.fields()) {
    const int64_t n = f->numel();
    *f = packed.narrow(0, offset, n).view(f->sizes());
    offset += n;
  }
  st.tokens = global_tokens;
  st.seq_len = seq_len;
  return st;
}

void StepStats::start_read() {
  if (host_.defined()) return;
  std::vector<at::Tensor> flat;
  // mtp is undefined in sums made without a model (no depth to read).
  for (at::Tensor* f : sums.fields())
    if (f->defined()) flat.push_back(f->flatten());
  if (grad_norm_t.defined()) flat.push_back(grad_norm_t.reshape({1}).to(at::kDouble));
  const at::Tensor packed = at::cat(flat);
  const at::Device device = packed.device();
  if (!device.is_cuda()) {
    // The CPU computes as it issues (and meta values are never read):
    // the copy is a snapshot taken now.
    host_ = device.is_cpu() ? packed.clone() : at::zeros(packed.sizes(), packed.options().device(at::kCPU));
    return;
  }
  // Queued behind this step's last kernel, so read() waits for this step
  // only, never for work enqueued after it.
  host_ = at::empty(packed.sizes(), packed.options().device(at::kCPU).pinned_memory(true));
  host_.copy_(packed, /*non_blocking=*/true);
  copied_ = std::make_shared<c10::Event>(device.type());
  copied_->record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
}

bool StepStats::landed() const { return !copied_ || copied_->query(); }

void StepStats::read() {
  if (read_done) return;
  read_done = true;
  start_read();
  if (copied_) copied_->synchronize();  // the one wait of the step, for its own copy
  const at::Tensor host = host_;
  if (pipeline_wait) pipeline_wait_seconds = pipeline_wait();
  if (pipeline_passes) pipeline_pass_seconds = pipeline_passes();
  const double* a = host.data_ptr<double>();
  const double ce = a[0], aux = a[1], z = a[2], dropped = a[3], assigned = a[4];
  loss = tokens > 0 ? ce / tokens : 0.0;
  const double sequences = seq_len > 0 ? tokens / static_cast<double>(seq_len) : 0.0;
  aux_loss = sequences > 0 ? aux / sequences : 0.0;
  z_loss = sequences > 0 ? z / sequences : 0.0;
  dropped_fraction = assigned > 0 ? dropped / assigned : 0.0;
  const int64_t n_layers = sums.expert_tokens.size(0), E = sums.expert_tokens.size(1);
  const double* experts = a + 5;
  expert_fraction.clear();
  for (int64_t l = 0; l < n_layers; ++l) {
    const double* row = experts + l * E;
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += row[e];
    if (total <= 0) continue;  // a dense layer
    std::vector<double> f(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) f[static_cast<size_t>(e)] = row[e] / total;
    expert_fraction.push_back(std::move(f));
  }
  const double* mtp = experts + n_layers * E;
  mtp_loss.assign(sums.mtp.defined() ? static_cast<size_t>(sums.mtp.numel()) : 0, 0.0);
  for (size_t k = 0; k < mtp_loss.size(); ++k) mtp_loss[k] = tokens > 0 ? mtp[k] / tokens : 0.0;
  if (grad_norm_t.defined()) grad_norm = a[host.size(0) - 1];
}

StepBatches next_step_batches(Session& s) {
  const Config& cfg = s.config();
  RunProgress& progress = s.progress();
  StepBatches b;
  // Batch-size rampup and sequence-length warmup (optim/rampup.h) set this
  // step's shape; the loss stays the mean over the tokens actually trained on.
  b.batch = global_batch_at(cfg, progress.consumed_samples);
  b.seq_len = seq_len_at(cfg, progress.step);
  for (int64_t r = 0; r < cfg.grad_step; ++r) {
    Batch raw = next_train_batch(s, b.batch, round_batch_at(cfg, progress.consumed_samples, r + 1));
    // Shorter sequences are the first T tokens of each (DeepSpeed's seqlen
    // truncation); the pipeline takes its activation shape from inputs.size(1).
    const at::Tensor in = raw.inputs.narrow(1, 0, b.seq_len).contiguous();
    const at::Tensor tg = raw.targets.narrow(1, 0, b.seq_len).contiguous();
    b.inputs.push_back(in.to(s.device(), /*non_blocking=*/true));
    b.targets.push_back(tg.to(s.device(), /*non_blocking=*/true));
    b.host_inputs.push_back(in.is_cpu() ? in : at::Tensor());
  }
  progress.consumed_samples += b.batch * cfg.grad_step;
  return b;
}

StepStats run_step(Session& s, const StepBatches& b) {
  const Config& cfg = s.config();
  ParallelModel& pm = s.model();
  Mesh& mesh = s.mesh();
  const int64_t step = s.progress().step + 1;
  pm.model->train();
  for (auto& p : pm.params) p.tensor.mutable_grad() = at::Tensor();
  const double global_tokens = static_cast<double>(b.batch * cfg.grad_step * b.seq_len);
  const double global_seqs = static_cast<double>(b.batch * cfg.grad_step);
  RoundSpec spec;
  spec.ce_scale = 1.0 / global_tokens;
  spec.aux_scale = cfg.alpha / global_seqs;
  spec.z_scale = cfg.model.router_z_loss / global_seqs;
  // L = L_main + lambda / D * sum_k L^k, each L^k over the step's tokens as the main loss (model/mtp.h).
  if (cfg.model.mtp_depth > 0)
    spec.mtp_scale = cfg.model.mtp_loss_weight / static_cast<double>(cfg.model.mtp_depth) / global_tokens;
  spec.backward_thread = s.options().backward_thread;
  RoundSums total;
  std::function<double()> wait;
  std::function<std::array<double, 3>()> passes;
  for (int64_t r = 0; r < cfg.grad_step; ++r) {
    spec.final_round = r + 1 == cfg.grad_step;  // gradients final: dp sum during backward (grad_buckets.h)
    CastScope casts(pm.model->precision());  // the round's microbatches share the weights' bf16 casts
    total += run_round(pm, mesh, cfg, b.inputs[static_cast<size_t>(r)], b.targets[static_cast<size_t>(r)], spec,
                       b.host_inputs[static_cast<size_t>(r)]);
  }
  if (mesh.shape().pp > 1) {
    // The pipeline bubble as the stages see it: time blocked waiting for a
    // neighbour, on the rank that waited most. Known when the step is read
    // (on CUDA, from events the stream has passed by then): every rank reads
    // every step, at the same point, so the host all-reduce lines up.
    wait = [waits = total.waits, &mesh] {
      double local = 0;
      for (const auto& f : waits) local += f();
      at::Tensor w = at::full({1}, local, at::kDouble);
      mesh.cpu_world().all_reduce(w, ReduceOp::Max);
      return w.item<double>();
    };
    RoundSums timed;  // the pass clocks alone: zero-bubble plans, on every rank
    timed.passes = total.passes;
    if (!timed.passes.empty())
      passes = [timed = std::move(timed), &mesh] {
        const std::array<double, 3> local = timed.pass_seconds();
        at::Tensor t = at::tensor({local[0], local[1], local[2]}, at::kDouble);
        mesh.cpu_world().all_reduce(t, ReduceOp::Sum);
        return std::array<double, 3>{t[0].item<double>(), t[1].item<double>(), t[2].item<double>()};
      };
  }
  s.test_hooks().after_backward(step, pm);
  // The gradients' remaining sums (tp, pp, dp): the data-parallel strategy's.
  s.data_parallel().reduce();
  StepStats stats = reduce_stats(s, total, global_tokens, b.seq_len);
  stats.pipeline_wait = std::move(wait);
  stats.pipeline_passes = std::move(passes);
  stats.batch_size = b.batch;
  return stats;
}

void begin_step(Session& s) {
  const int64_t step = s.progress().step + 1;
  s.test_hooks().before_step(step, s.world_rank());
  s.watchdog().beat("train step " + std::to_string(step));
}

StepStats train_step(Session& s) {
  begin_step(s);
  return run_step(s, next_step_batches(s));
}

void apply_update(Session& s, StepStats& st, const LearningRate& lr) {
  at::NoGradGuard ng;
  const at::Tensor norm = s.data_parallel().grad_norm();
  st.grad_norm_t = norm;
  // Everything below stays on the device. A non-finite loss or norm skips
  // the update there (found_inf); nan_policy acts when the step is read.
  const at::Tensor ce = st.sums.ce.squeeze(0);
  const at::Tensor found_inf = at::logical_not(at::isfinite(ce) & at::isfinite(norm)).to(at::kFloat);
  at::Tensor grad_scale;
  const double clip_norm = s.config().grad_clip_norm;
  if (clip_norm > 0) {
    // Clip only above the threshold, as min(1, c / (norm + 1e-6)) would not:
    // the gradients are divided by (norm + 1e-6) / c inside the fused update.
    const at::Tensor clip = at::full({}, clip_norm, norm.options());
    grad_scale = at::where(norm > clip, (norm + 1e-6) / clip, at::ones_like(norm)).to(at::kFloat);
  }
  s.data_parallel().update(lr, found_inf, grad_scale);
}

}  // namespace meshtrain
