// Interleaved 1F1B: the compute order is Megatron-Core's
// (forward_backward_pipelining_with_interleaving); the transfers are placed
// by replaying that order on an idealised timeline (forward 1, backward 2
// time units) on which a transfer happens at a moment when neither stage is
// computing. Megatron pairs its transfers in batched isend/irecv; here every
// stage's plan is the projection of one global sequence of events in which
// each send meets its receive, so no run of the plans can deadlock under
// plain blocking (rendezvous) send/recv, and both ends of every rank pair see
// its messages in one order (NCCL ignores tags). On the timeline the plans
// reach Megatron's bubble, (pp - 1) / (v * n_mb) of the compute.
#include "interleaved_plan.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

struct Compute {
  bool forward;
  int64_t microbatch, chunk;
};

// The k-th forward (or backward) of a stage: microbatches go in groups of pp
// through chunk 0, 1, ... v - 1 (backward: v - 1 first). A trailing group of
// fewer (forward-only plans of any size) goes the same way.
Compute virtual_microbatch(int64_t k, int pp, int64_t v, int64_t n_mb, bool forward) {
  const int64_t group = k / (pp * v);
  const int64_t size = std::min<int64_t>(pp, n_mb - group * pp);
  const int64_t in_group = k - group * pp * v;
  const int64_t chunk = in_group / size;
  return {forward, group * pp + in_group % size, forward ? chunk : v - 1 - chunk};
}

std::vector<Compute> compute_order(int stage, int pp, int64_t v, int64_t n_mb, bool backward) {
  const int64_t total = n_mb * v;
  std::vector<Compute> out;
  auto fwd = [&](int64_t k) { out.push_back(virtual_microbatch(k, pp, v, n_mb, true)); };
  auto bwd = [&](int64_t k) { out.push_back(virtual_microbatch(k, pp, v, n_mb, false)); };
  if (!backward) {
    for (int64_t k = 0; k < total; ++k) fwd(k);
    return out;
  }
  // Megatron's warm-up: enough forwards that the first backward of the last
  // chunk finds its gradient, two per later stage (its forward and the
  // backward's way back).
  const int64_t warmup = std::min<int64_t>(total, 2 * (pp - stage - 1) + (v - 1) * pp);
  const int64_t steady = total - warmup;
  for (int64_t k = 0; k < warmup; ++k) fwd(k);
  for (int64_t k = 0; k < steady; ++k) {
    fwd(warmup + k);
    bwd(k);
  }
  for (int64_t k = steady; k < total; ++k) bwd(k);
  return out;
}

class Timeline {
 public:
  Timeline(int pp, int64_t v, int64_t n_mb, bool backward)
      : pp_(pp), v_(v), next_(static_cast<size_t>(pp), 0), busy_until_(static_cast<size_t>(pp), 0),
        pending_(static_cast<size_t>(pp)), arrived_(static_cast<size_t>(pp)), plans_(static_cast<size_t>(pp)) {
    for (int s = 0; s < pp; ++s) order_.push_back(compute_order(s, pp, v, n_mb, backward));
  }

  std::vector<std::vector<PipeOp>> run() {
    int64_t limit = 16;  // every compute costs at most 2, so a working order ends well within this
    for (const auto& o : order_) limit += 4 * static_cast<int64_t>(o.size());
    for (int64_t t = 0; !done(); ++t) {
      MT_ASSERT(t <= limit, "the interleaved pipeline order stalls (pp ", pp_, ", v ", v_, ")");
      for (int s = 0; s < pp_; ++s) transfer(s, t);
      for (int s = 0; s < pp_; ++s) compute(s, t);
    }
    return plans_;
  }

 private:
  using Key = std::tuple<bool, int64_t, int64_t>;  // (activation?, microbatch, chunk) a stage has received

  bool first_virtual(int s, int64_t chunk) const { return s == 0 && chunk == 0; }
  bool last_virtual(int s, int64_t chunk) const { return s == pp_ - 1 && chunk == v_ - 1; }
  size_t at(int s) const { return static_cast<size_t>(s); }

  bool done() const {
    for (int s = 0; s < pp_; ++s)
      if (next_[at(s)] < order_[at(s)].size() || !pending_[at(s)].empty()) return false;
    return true;
  }

  // Stage s, if not computing at time t, hands its finished outputs to the
  // neighbours that are not computing either. The others wait while s goes
  // on computing: the send moves later in s's plan, to a time both are free
  // (sending at once would block s on a busy receiver: on this timeline that
  // costs up to one backward per transfer, beyond Megatron's bubble).
  void transfer(int s, int64_t t) {
    if (busy_until_[at(s)] > t) return;
    auto& pending = pending_[at(s)];
    std::vector<PipeOp> waiting;
    for (const PipeOp& send : pending) {
      const bool fwd = send.step == PipeStep::SendForward;
      const int peer = fwd ? (s + 1) % pp_ : (s + pp_ - 1) % pp_;
      if (busy_until_[at(peer)] > t) {
        waiting.push_back(send);
        continue;
      }
      // The chunk wraps from the last stage to the first one's next chunk.
      const int64_t chunk = fwd ? send.chunk + (s == pp_ - 1 ? 1 : 0) : send.chunk - (s == 0 ? 1 : 0);
      plans_[at(s)].push_back(send);
      plans_[at(peer)].push_back({fwd ? PipeStep::RecvForward : PipeStep::RecvBackward, send.microbatch, chunk});
      arrived_[at(peer)].insert({fwd, send.microbatch, chunk});
    }
    pending = std::move(waiting);
  }

  // Stage s, if not computing at time t, starts its next compute once the input is here.
  void compute(int s, int64_t t) {
    auto& next = next_[at(s)];
    if (busy_until_[at(s)] > t || next >= order_[at(s)].size()) return;
    const Compute c = order_[at(s)][next];
    const bool needs_input = c.forward ? !first_virtual(s, c.chunk) : !last_virtual(s, c.chunk);
    if (needs_input && arrived_[at(s)].count({c.forward, c.microbatch, c.chunk}) == 0) return;
    plans_[at(s)].push_back({c.forward ? PipeStep::Forward : PipeStep::Backward, c.microbatch, c.chunk});
    busy_until_[at(s)] = t + (c.forward ? 1 : 2);
    auto& pending = pending_[at(s)];
    if (c.forward && !last_virtual(s, c.chunk)) pending.push_back({PipeStep::SendForward, c.microbatch, c.chunk});
    if (!c.forward && !first_virtual(s, c.chunk)) pending.push_back({PipeStep::SendBackward, c.microbatch, c.chunk});
    ++next;
  }

  const int pp_;
  const int64_t v_;
  std::vector<std::vector<Compute>> order_;
  std::vector<size_t> next_;
  std::vector<int64_t> busy_until_;
  std::vector<std::vector<PipeOp>> pending_;  // finished outputs not yet sent
  std::vector<std::set<Key>> arrived_;
  std::vector<std::vector<PipeOp>> plans_;
};

}  // namespace

std::vector<std::vector<PipeOp>> interleaved_plans(int pp, int64_t v, int64_t n_mb, bool backward) {
  return Timeline(pp, v, n_mb, backward).run();
}

}  // namespace meshtrain
