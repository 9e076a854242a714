#include "meshtrain/parallel/microbatch.h"

#include <ATen/ThreadLocalState.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <thread>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

at::Tensor plus(const at::Tensor& sum, const at::Tensor& x) { return sum.defined() ? sum + x : x; }

}  // namespace

RoundSums& RoundSums::operator+=(const RoundSums& o) {
  if (o.ce_sum.defined()) ce_sum = plus(ce_sum, o.ce_sum);
  tokens += o.tokens;
  if (o.aux_sum.defined()) aux_sum = plus(aux_sum, o.aux_sum);
  if (o.z_sum.defined()) z_sum = plus(z_sum, o.z_sum);
  if (o.dropped.defined()) dropped = plus(dropped, o.dropped);
  if (o.assigned.defined()) assigned = plus(assigned, o.assigned);
  if (expert_tokens.size() < o.expert_tokens.size()) expert_tokens.resize(o.expert_tokens.size());
  for (size_t l = 0; l < o.expert_tokens.size(); ++l)
    if (o.expert_tokens[l].defined()) expert_tokens[l] = plus(expert_tokens[l], o.expert_tokens[l]);
  if (mtp_expert_tokens.size() < o.mtp_expert_tokens.size()) mtp_expert_tokens.resize(o.mtp_expert_tokens.size());
  for (size_t j = 0; j < o.mtp_expert_tokens.size(); ++j)
    if (o.mtp_expert_tokens[j].defined()) mtp_expert_tokens[j] = plus(mtp_expert_tokens[j], o.mtp_expert_tokens[j]);
  if (mtp_sum.size() < o.mtp_sum.size()) mtp_sum.resize(o.mtp_sum.size());
  for (size_t k = 0; k < o.mtp_sum.size(); ++k)
    if (o.mtp_sum[k].defined()) mtp_sum[k] = plus(mtp_sum[k], o.mtp_sum[k]);
  peak_live_microbatches = std::max(peak_live_microbatches, o.peak_live_microbatches);
  waits.insert(waits.end(), o.waits.begin(), o.waits.end());
  passes.insert(passes.end(), o.passes.begin(), o.passes.end());
  return *this;
}

std::array<double, 3> RoundSums::pass_seconds() const {
  std::array<double, 3> s{};
  for (const auto& f : passes) {
    const std::array<double, 3> p = f();
    for (size_t i = 0; i < 3; ++i) s[i] += p[i];
  }
  return s;
}

double RoundSums::wait_seconds() const {
  double s = 0;
  for (const auto& w : waits) s += w();
  return s;
}

double sum_value(const at::Tensor& t) { return t.defined() ? t.item<double>() : 0.0; }

std::vector<Microbatch> split_microbatches(const Config& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                                           const at::Tensor& host_inputs) {
  const int64_t b = inputs.size(0);
  const int64_t mb = cfg.data.micro_batch_size > 0 ? std::min<int64_t>(cfg.data.micro_batch_size, b) : b;
  MT_CHECK(b % mb == 0, "data_config.micro_batch_size=", mb, " must divide the per-dp-rank batch ", b);
  MT_ASSERT(!host_inputs.defined() || host_inputs.size(0) == b, "microbatches: ", host_inputs.size(0),
            " host rows for ", b);
  std::vector<Microbatch> out;
  for (int64_t s = 0; s < b; s += mb) {
    Microbatch m{inputs.narrow(0, s, mb), targets.narrow(0, s, mb)};
    if (host_inputs.defined()) m.host_inputs = host_inputs.narrow(0, s, mb);
    out.push_back(std::move(m));
  }
  return out;
}

void accumulate_aux(RoundSums& sums, const ForwardAux& aux, int64_t sequences, int64_t first_moe_layer) {
  // fp64 on the device, as the host sums were: no read until the step logs.
  const double seqs = static_cast<double>(sequences);
  auto f64 = [](const at::Tensor& t) { return t.detach().to(at::kDouble); };
  if (aux.aux_loss.defined()) sums.aux_sum = plus(sums.aux_sum, f64(aux.aux_loss) * seqs);
  if (aux.z_loss.defined()) sums.z_sum = plus(sums.z_sum, f64(aux.z_loss) * seqs);
  if (aux.dropped.defined()) sums.dropped = plus(sums.dropped, f64(aux.dropped));
  if (aux.assigned.defined()) sums.assigned = plus(sums.assigned, f64(aux.assigned));
  const size_t first = static_cast<size_t>(first_moe_layer);
  if (sums.expert_tokens.size() < first + aux.expert_tokens.size())
    sums.expert_tokens.resize(first + aux.expert_tokens.size());
  for (size_t l = 0; l < aux.expert_tokens.size(); ++l)
    sums.expert_tokens[first + l] = plus(sums.expert_tokens[first + l], f64(aux.expert_tokens[l]));
  if (sums.mtp_expert_tokens.size() < aux.mtp_expert_tokens.size())
    sums.mtp_expert_tokens.resize(aux.mtp_expert_tokens.size());
  for (size_t j = 0; j < aux.mtp_expert_tokens.size(); ++j)
    if (aux.mtp_expert_tokens[j].defined())
      sums.mtp_expert_tokens[j] = plus(sums.mtp_expert_tokens[j], f64(aux.mtp_expert_tokens[j]));
}

void accumulate_losses(RoundSums& sums, const at::Tensor& token_losses) {
  sums.ce_sum = plus(sums.ce_sum, token_losses.detach().sum().to(at::kDouble));
  sums.tokens += static_cast<double>(token_losses.numel());
}

void accumulate_mtp(RoundSums& sums, const std::vector<at::Tensor>& mtp_losses) {
  if (sums.mtp_sum.size() < mtp_losses.size()) sums.mtp_sum.resize(mtp_losses.size());
  for (size_t k = 0; k < mtp_losses.size(); ++k)
    sums.mtp_sum[k] = plus(sums.mtp_sum[k], mtp_losses[k].detach().sum().to(at::kDouble));
}

void add_mtp_targets(std::vector<Microbatch>& mbs, const Config& cfg) {
  if (cfg.model.mtp_depth == 0) return;
  // Documents end where attention's do (lay_out_tokens): no prediction across one.
  const int64_t eot = cfg.data.document_masking ? cfg.data.eot_token : -1;
  for (Microbatch& m : mbs) m.mtp = mtp_targets(m.inputs, m.targets, cfg.model.mtp_depth, eot);
}

void run_backward(const RoundSpec& spec, const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads) {
  if (!spec.backward_thread) {
    torch::autograd::backward(roots, grads);
    return;
  }
  const at::ThreadLocalState state;
  std::exception_ptr error;
  std::thread t([&] {
    try {
      at::ThreadLocalStateGuard guard(state);
      torch::autograd::backward(roots, grads);
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
}

at::Tensor stage_loss(const at::Tensor& token_losses, const ForwardAux& aux, int64_t sequences, const RoundSpec& spec,
                      const std::vector<at::Tensor>& mtp_losses) {
  at::Tensor loss = token_losses.sum() * spec.ce_scale;
  for (const at::Tensor& l : mtp_losses) loss = loss + l.sum() * spec.mtp_scale;
  const double seqs = static_cast<double>(sequences);
  if (aux.aux_loss.defined() && spec.aux_scale != 0.0) loss = loss + aux.aux_loss * (spec.aux_scale * seqs);
  if (aux.z_loss.defined() && spec.z_scale != 0.0) loss = loss + aux.z_loss * (spec.z_scale * seqs);
  return loss;
}

}  // namespace meshtrain
