// Zero-bubble plans (see pipeline_plan.h) on a timeline where each pass takes
// its cost (event-driven: time jumps to the next moment a stage frees up),
// transfers placed where neither end computes (as interleaved_plan.cpp does),
// so the plans are projections of one global order of events. Each stage
// picks its next pass greedily by one rule (compute below), as the paper's
// automatic scheduler does with profiled costs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <set>
#include <tuple>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/pipeline_plan.h"

namespace meshtrain {

ChunkPlace place_of_virtual_stage(int64_t vs, int pp, int64_t v, bool v_shape) {
  MT_ASSERT(vs >= 0 && vs < pp * v && (!v_shape || v == 2), "virtual stage ", vs, " of pp ", pp, " x v ", v);
  if (v_shape) return vs < pp ? ChunkPlace{static_cast<int>(vs), 0} : ChunkPlace{static_cast<int>(2 * pp - 1 - vs), 1};
  return {static_cast<int>(vs % pp), vs / pp};
}

int64_t virtual_stage_of(int stage, int64_t chunk, int pp, bool v_shape) {
  if (v_shape) return chunk == 0 ? stage : 2 * pp - 1 - stage;
  return chunk * pp + stage;
}

namespace {

size_t at(int s) { return static_cast<size_t>(s); }

// The greedy timeline of one zero-bubble schedule.
class ZeroBubbleTimeline {
 public:
  ZeroBubbleTimeline(ZeroBubble kind, int pp, int64_t n_mb, bool backward, const PassCosts& costs)
      : pp_(pp), v_(kind == ZeroBubble::V ? 2 : 1), n_mb_(n_mb), backward_(backward), costs_(costs),
        stages_(at(pp)) {
    for (int s = 0; s < pp; ++s) {
      Stage& st = stages_[at(s)];
      st.next_forward.assign(static_cast<size_t>(v_), 0);
      // Microbatches alive on a stage (forward done, W not yet) hold its
      // activations: at most 1F1B's peak, pp - s whole microbatches (V: 2pp
      // chunk halves on every stage).
      st.alive_cap = !backward ? n_mb * v_ : kind == ZeroBubble::H1 ? pp - s : 2 * pp;
    }
  }

  std::vector<std::vector<PipeOp>> run() {
    int64_t guard = 0;
    const int64_t limit = 64 + 16 * static_cast<int64_t>(pp_) * v_ * n_mb_;
    for (double t = 0; !done(); t = next_event(t)) {
      MT_ASSERT(++guard <= limit, "the zero-bubble order stalls (pp ", pp_, ", ", n_mb_, " microbatches)");
      for (int s = 0; s < pp_; ++s) transfer(s, t);
      for (int s = 0; s < pp_; ++s) compute(s, t);
    }
    std::vector<std::vector<PipeOp>> plans;
    for (Stage& st : stages_) plans.push_back(std::move(st.plan));
    return plans;
  }

 private:
  using Key = std::tuple<bool, int64_t, int64_t>;  // (activation?, microbatch, chunk) arrived

  struct Stage {
    std::vector<int64_t> next_forward;           // per chunk: the next microbatch to run forward
    std::set<std::pair<int64_t, int64_t>> forwarded;  // (chunk, mb) whose forward ran, B not yet
    std::set<Key> arrived;
    std::deque<std::pair<int64_t, int64_t>> weights;  // (mb, chunk) whose B ran, W not yet
    std::vector<PipeOp> pending;                 // finished outputs not yet sent
    std::vector<PipeOp> plan;
    double busy_until = 0;
    int64_t alive = 0, alive_cap = 0, done = 0;
    int64_t alive_early = 0;  // of those, the V's first chunk (down the stages)
  };

  // Nothing changes between the moments stages free up: the earliest one
  // after t (a stage that is free and idle waits for another's pass). When
  // every stage is free at t, the next round of transfers and passes runs at
  // t; the guard above catches a timeline on which nothing moves.
  double next_event(double t) const {
    double next = std::numeric_limits<double>::infinity();
    for (const Stage& st : stages_)
      if (st.busy_until > t) next = std::min(next, st.busy_until);
    return std::isinf(next) ? t : next;
  }

  bool first_virtual(int s, int64_t c) const { return virtual_stage_of(s, c, pp_, v_ == 2) == 0; }
  bool last_virtual(int s, int64_t c) const { return virtual_stage_of(s, c, pp_, v_ == 2) == pp_ * v_ - 1; }

  bool done() const {
    for (const Stage& st : stages_)
      if (st.done < (backward_ ? 3 : 1) * n_mb_ * v_ || !st.pending.empty()) return false;
    return true;
  }

  // Where the output of (s, chunk) goes, forward or backward.
  ChunkPlace neighbour(int s, int64_t chunk, bool forward) const {
    const int64_t vs = virtual_stage_of(s, chunk, pp_, v_ == 2) + (forward ? 1 : -1);
    return place_of_virtual_stage(vs, pp_, v_, v_ == 2);
  }

  void transfer(int s, double t) {
    Stage& st = stages_[at(s)];
    if (st.busy_until > t) return;
    std::vector<PipeOp> waiting;
    for (const PipeOp& send : st.pending) {
      const bool fwd = send.step == PipeStep::SendForward;
      const ChunkPlace to = neighbour(s, send.chunk, fwd);
      Stage& peer = stages_[at(to.stage)];
      if (to.stage == s) {  // the V's turn: the next chunk is on this stage
        st.arrived.insert({fwd, send.microbatch, to.chunk});
        continue;
      }
      if (peer.busy_until > t) {
        waiting.push_back(send);
        continue;
      }
      st.plan.push_back(send);
      peer.plan.push_back({fwd ? PipeStep::RecvForward : PipeStep::RecvBackward, send.microbatch, to.chunk});
      peer.arrived.insert({fwd, send.microbatch, to.chunk});
    }
    st.pending = std::move(waiting);
  }

  // The stage's next pass, by the rule: a B whose gradient is here (the
  // later chunk first), else a forward within the memory cap (likewise),
  // else a W; else it idles.
  void compute(int s, double t) {
    Stage& st = stages_[at(s)];
    if (st.busy_until > t) return;
    for (int64_t c = v_ - 1; c >= 0; --c)
      for (const auto& [chunk, mb] : st.forwarded)
        if (chunk == c && (last_virtual(s, c) || st.arrived.count({false, mb, c}))) return run_input(s, st, mb, c, t);
    if (st.alive < st.alive_cap)
      for (int64_t c = v_ - 1; c >= 0; --c) {
        const int64_t mb = st.next_forward[static_cast<size_t>(c)];
        // The V keeps a slot for a later chunk's forward: with every slot
        // taken by first-chunk halves, each waiting for a second-chunk
        // forward somewhere, no stage could move (when passes differ in
        // length the greedy order can get there).
        if (c < v_ - 1 && st.alive_early >= st.alive_cap - 1) continue;
        if (mb < n_mb_ && (first_virtual(s, c) || st.arrived.count({true, mb, c}))) return run_forward(s, st, mb, c, t);
      }
    if (!st.weights.empty()) run_weight(st, t);
  }

  void run_forward(int s, Stage& st, int64_t mb, int64_t c, double t) {
    st.plan.push_back({PipeStep::Forward, mb, c});
    ++st.next_forward[static_cast<size_t>(c)];
    st.forwarded.insert({c, mb});
    ++st.alive;
    if (c < v_ - 1) ++st.alive_early;
    ++st.done;
    st.busy_until = t + costs_.forward;
    if (!last_virtual(s, c)) st.pending.push_back({PipeStep::SendForward, mb, c});
    if (!backward_) {  // nothing waits for a backward
      st.forwarded.erase({c, mb});
      --st.alive;
      if (c < v_ - 1) --st.alive_early;
    }
  }

  void run_input(int s, Stage& st, int64_t mb, int64_t c, double t) {
    st.plan.push_back({PipeStep::BackwardInput, mb, c});
    st.forwarded.erase({c, mb});
    ++st.done;
    st.weights.push_back({mb, c});
    st.busy_until = t + costs_.backward_input;
    if (!first_virtual(s, c)) st.pending.push_back({PipeStep::SendBackward, mb, c});
  }

  void run_weight(Stage& st, double t) {
    const auto [mb, c] = st.weights.front();
    st.weights.pop_front();
    --st.alive;
    if (c < v_ - 1) --st.alive_early;
    st.plan.push_back({PipeStep::BackwardWeight, mb, c});
    ++st.done;
    st.busy_until = t + costs_.backward_weight;
  }

  const int pp_;
  const int64_t v_, n_mb_;
  const bool backward_;
  const PassCosts costs_;
  std::vector<Stage> stages_;
};

double cost_of(PipeStep s, const PassCosts& c) {
  switch (s) {
    case PipeStep::Forward: return c.forward;
    case PipeStep::Backward: return c.backward_input + c.backward_weight;
    case PipeStep::BackwardInput: return c.backward_input;
    case PipeStep::BackwardWeight: return c.backward_weight;
    default: return 0;
  }
}

bool is_transfer(PipeStep s) {
  return s == PipeStep::SendForward || s == PipeStep::SendBackward || s == PipeStep::RecvForward ||
         s == PipeStep::RecvBackward;
}

}  // namespace

std::vector<std::vector<PipeOp>> zero_bubble_plans(ZeroBubble kind, int pp, int64_t n_mb, bool backward,
                                                   const PassCosts& costs) {
  MT_CHECK(pp >= 1 && n_mb >= 1, "a zero-bubble pipeline needs a stage and a microbatch, got pp ", pp, ", ", n_mb);
  MT_CHECK(costs.forward > 0 && costs.backward_input > 0 && costs.backward_weight > 0,
           "a zero-bubble plan's pass costs must be positive, got forward ", costs.forward, ", B ",
           costs.backward_input, ", W ", costs.backward_weight);
  auto plans = ZeroBubbleTimeline(kind, pp, n_mb, backward, costs).run();
  const PassCosts equal;
  if (!backward || (costs.forward == equal.forward && costs.backward_input == equal.backward_input &&
                    costs.backward_weight == equal.backward_weight))
    return plans;
  // The greedy rule is a heuristic: knowing the costs can also make a plan
  // worse. Keep whichever of the two timelines' plans runs shorter with the
  // real costs (the equal-cost one on a tie, as before costs were known).
  auto plain = ZeroBubbleTimeline(kind, pp, n_mb, backward, equal).run();
  const int64_t v = kind == ZeroBubble::V ? 2 : 1;
  const bool v_shape = kind == ZeroBubble::V;
  const double with_costs = time_plans(plans, v, v_shape, costs).makespan;
  return with_costs < time_plans(plain, v, v_shape, costs).makespan * (1 - 1e-9) ? plans : plain;
}

PlanTiming time_plans(const std::vector<std::vector<PipeOp>>& plans, int64_t v, bool v_shape, const PassCosts& costs) {
  // Each stage runs its plan in order; a send and the receive it meets
  // complete together, at the later of the two ends' clocks.
  const int pp = static_cast<int>(plans.size());
  std::vector<size_t> pc(at(pp), 0);
  std::vector<double> clock(at(pp), 0), busy(at(pp), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      auto& i = pc[at(s)];
      while (i < plans[at(s)].size() && !is_transfer(plans[at(s)][i].step)) {
        const double c = cost_of(plans[at(s)][i++].step, costs);
        clock[at(s)] += c;
        busy[at(s)] += c;
        progress = true;
      }
      if (i >= plans[at(s)].size()) continue;
      const PipeOp& op = plans[at(s)][i];
      if (op.step != PipeStep::SendForward && op.step != PipeStep::SendBackward) continue;
      const bool fwd = op.step == PipeStep::SendForward;
      const int64_t vs = virtual_stage_of(s, op.chunk, pp, v_shape) + (fwd ? 1 : -1);
      const int peer = place_of_virtual_stage(vs, pp, v, v_shape).stage;
      auto& j = pc[at(peer)];
      if (j >= plans[at(peer)].size()) continue;
      const PipeOp& got = plans[at(peer)][j];
      if (got.step != (fwd ? PipeStep::RecvForward : PipeStep::RecvBackward) || got.microbatch != op.microbatch) continue;
      // Only a receive from this stage takes the message.
      const int64_t from = virtual_stage_of(peer, got.chunk, pp, v_shape) + (fwd ? -1 : 1);
      if (place_of_virtual_stage(from, pp, v, v_shape).stage != s) continue;
      clock[at(s)] = clock[at(peer)] = std::max(clock[at(s)], clock[at(peer)]);
      ++i;
      ++j;
      progress = true;
    }
  }
  for (int s = 0; s < pp; ++s)
    MT_ASSERT(pc[at(s)] == plans[at(s)].size(), "time_plans: stage ", s, " stops at step ", pc[at(s)], " of ",
              plans[at(s)].size(), " (the plans deadlock)");
  PlanTiming t;
  t.makespan = *std::max_element(clock.begin(), clock.end());
  double work = 0;
  for (double b : busy) work += b;
  t.idle_fraction = t.makespan > 0 ? 1.0 - work / (t.makespan * pp) : 0.0;
  return t;
}

}  // namespace meshtrain
