// Zero-bubble pipeline plans (pipeline_plan.h: zero_bubble_plans), no MPI:
// every stage's steps replayed together under blocking (rendezvous)
// send/recv never deadlock, every message meets the receive meant for it,
// every microbatch's F, B and W of every virtual stage run exactly once and
// in order, memory stays within 1F1B's, and the idle time the plans leave is
// below 1F1B's (H1) and interleaved 1F1B's (V).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/parallel/pipeline_plan.h"

namespace meshtrain {
namespace {

struct Replay {
  bool ok = true;
  std::string why;
  std::vector<int64_t> peak_alive;  // per stage: microbatch chunks whose forward ran and W not yet
};

std::string describe(int s, const PipeOp& op) {
  return "stage " + std::to_string(s) + " " + step_name(op.step) + "(mb " + std::to_string(op.microbatch) +
         ", chunk " + std::to_string(op.chunk) + ")";
}

bool is_send(PipeStep s) { return s == PipeStep::SendForward || s == PipeStep::SendBackward; }
bool is_recv(PipeStep s) { return s == PipeStep::RecvForward || s == PipeStep::RecvBackward; }

// The replay knows the layout by itself: V puts virtual stages s and 2pp-1-s
// on stage s, with the turn at the last stage local.
Replay replay(const std::vector<std::vector<PipeOp>>& plans, int64_t v, bool v_shape, int64_t n_mb) {
  const int pp = static_cast<int>(plans.size());
  const int64_t nv = pp * v;
  auto vstage = [&](int s, int64_t c) { return v_shape ? (c == 0 ? s : 2 * pp - 1 - s) : c * pp + s; };
  auto place = [&](int64_t vs) {
    if (v_shape) return vs < pp ? std::make_pair(static_cast<int>(vs), int64_t{0})
                                : std::make_pair(static_cast<int>(2 * pp - 1 - vs), int64_t{1});
    return std::make_pair(static_cast<int>(vs % pp), vs / pp);
  };
  Replay r;
  auto fail = [&](const std::string& why) {
    r.ok = false;
    r.why = why;
    return r;
  };
  using Done = std::tuple<char, int64_t, int64_t>;  // F B W, a(ctivation) g(radient) received
  std::vector<std::set<Done>> done(static_cast<size_t>(pp));
  std::vector<size_t> pc(static_cast<size_t>(pp), 0);
  std::vector<int64_t> alive(static_cast<size_t>(pp), 0);
  r.peak_alive.assign(static_cast<size_t>(pp), 0);
  auto arrive = [&](int s, char what, int64_t mb, int64_t c) { done[static_cast<size_t>(s)].insert({what, mb, c}); };
  for (;;) {
    bool progress = false, finished = true;
    for (int s = 0; s < pp; ++s) {
      const size_t si = static_cast<size_t>(s);
      auto& i = pc[si];
      while (i < plans[si].size() && !is_send(plans[si][i].step) && !is_recv(plans[si][i].step)) {
        const PipeOp& op = plans[si][i];
        const int64_t vs = vstage(s, op.chunk);
        char kind = op.step == PipeStep::Forward ? 'F' : op.step == PipeStep::BackwardInput ? 'B' : 'W';
        if (op.step != PipeStep::Forward && op.step != PipeStep::BackwardInput && op.step != PipeStep::BackwardWeight)
          return fail(describe(s, op) + ": not a zero-bubble pass");
        if (done[si].count({kind, op.microbatch, op.chunk})) return fail(describe(s, op) + " runs twice");
        if (kind == 'F' && vs > 0 && !done[si].count({'a', op.microbatch, op.chunk}))
          return fail(describe(s, op) + " before its activation");
        if (kind == 'B' && (!done[si].count({'F', op.microbatch, op.chunk}) ||
                            (vs < nv - 1 && !done[si].count({'g', op.microbatch, op.chunk}))))
          return fail(describe(s, op) + " before its forward or its gradient");
        if (kind == 'W' && !done[si].count({'B', op.microbatch, op.chunk})) return fail(describe(s, op) + " before B");
        done[si].insert({kind, op.microbatch, op.chunk});
        if (kind == 'F') r.peak_alive[si] = std::max(r.peak_alive[si], ++alive[si]);
        if (kind == 'W') --alive[si];
        // The V's turn hands chunk 0's output to chunk 1 on this stage.
        if (kind == 'F' && vs + 1 < nv && place(vs + 1).first == s) arrive(s, 'a', op.microbatch, place(vs + 1).second);
        if (kind == 'B' && vs > 0 && place(vs - 1).first == s) arrive(s, 'g', op.microbatch, place(vs - 1).second);
        ++i;
        progress = true;
      }
      if (i >= plans[si].size()) continue;
      finished = false;
      const PipeOp& op = plans[si][i];
      if (!is_send(op.step)) continue;  // a receive waits for its sender
      const bool fwd = op.step == PipeStep::SendForward;
      const int64_t vs = vstage(s, op.chunk) + (fwd ? 1 : -1);
      if (vs < 0 || vs >= nv) return fail(describe(s, op) + ": no peer");
      const auto [peer, chunk] = place(vs);
      if (peer == s) return fail(describe(s, op) + ": a transfer to itself");
      if (!done[si].count({fwd ? 'F' : 'B', op.microbatch, op.chunk})) return fail(describe(s, op) + " before its pass");
      const size_t pi = static_cast<size_t>(peer);
      if (pc[pi] >= plans[pi].size()) return fail(describe(s, op) + ": the peer has ended");
      const PipeOp& got = plans[pi][pc[pi]];
      if (!is_recv(got.step)) continue;  // the peer is busy: wait
      // A receive from another rank does not take this message (NCCL
      // matches per pair of ranks): wait.
      const int64_t from = vstage(peer, got.chunk) + (got.step == PipeStep::RecvForward ? -1 : 1);
      if (from < 0 || from >= nv || place(from).first != s) continue;
      if (got.step != (fwd ? PipeStep::RecvForward : PipeStep::RecvBackward) || got.microbatch != op.microbatch ||
          got.chunk != chunk)
        return fail(describe(s, op) + " meets " + describe(peer, got));
      arrive(peer, fwd ? 'a' : 'g', got.microbatch, got.chunk);
      ++i;
      ++pc[pi];
      progress = true;
    }
    if (finished) break;
    if (!progress) {
      std::string why = "deadlock:";
      for (int s = 0; s < pp; ++s)
        if (pc[static_cast<size_t>(s)] < plans[static_cast<size_t>(s)].size())
          why += " " + describe(s, plans[static_cast<size_t>(s)][pc[static_cast<size_t>(s)]]) + ";";
      return fail(why);
    }
  }
  for (int s = 0; s < pp; ++s)
    for (int64_t mb = 0; mb < n_mb; ++mb)
      for (int64_t c = 0; c < v; ++c)
        for (char k : {'F', 'B', 'W'})
          if (!done[static_cast<size_t>(s)].count({k, mb, c}))
            return fail("stage " + std::to_string(s) + " never runs " + k + " of mb " + std::to_string(mb) +
                        ", chunk " + std::to_string(c));
  return r;
}

std::vector<std::vector<PipeOp>> plans_of(PipelineSchedule schedule, int pp, int64_t n_mb, int64_t v) {
  std::vector<std::vector<PipeOp>> plans;
  for (int s = 0; s < pp; ++s) plans.push_back(pipeline_plan(schedule, s, pp, n_mb, true, v));
  return plans;
}

TEST(ZeroBubblePlan, H1AndVNeverDeadlockAndRunEveryPassOnce) {
  for (int pp = 2; pp <= 8; ++pp)
    for (int64_t n_mb = 1; n_mb <= 3 * pp; ++n_mb) {
      SCOPED_TRACE("pp " + std::to_string(pp) + ", " + std::to_string(n_mb) + " microbatches");
      const Replay h1 = replay(zero_bubble_plans(ZeroBubble::H1, pp, n_mb), 1, false, n_mb);
      ASSERT_TRUE(h1.ok) << "H1: " << h1.why;
      // plan_peak_live (what plan and the executor count) is the replay's.
      const auto h1_plans = zero_bubble_plans(ZeroBubble::H1, pp, n_mb);
      const auto v_plans = zero_bubble_plans(ZeroBubble::V, pp, n_mb);
      for (int s = 0; s < pp; ++s) {  // 1F1B's activation memory: forward done, W not yet
        EXPECT_LE(h1.peak_alive[static_cast<size_t>(s)], std::min<int64_t>(pp - s, n_mb)) << "H1 stage " << s;
        EXPECT_EQ(plan_peak_live(h1_plans[static_cast<size_t>(s)]), h1.peak_alive[static_cast<size_t>(s)]);
      }
      const Replay v = replay(v_plans, 2, true, n_mb);
      ASSERT_TRUE(v.ok) << "V: " << v.why;
      for (int s = 0; s < pp; ++s) {  // chunk halves: 1F1B's first stage holds pp whole microbatches
        EXPECT_LE(v.peak_alive[static_cast<size_t>(s)], 2 * pp) << "V stage " << s;
        EXPECT_EQ(plan_peak_live(v_plans[static_cast<size_t>(s)]), v.peak_alive[static_cast<size_t>(s)]);
      }
    }
}

TEST(ZeroBubblePlan, LayoutsPlaceEveryVirtualStageOnce) {
  for (int pp : {1, 2, 5})
    for (bool v_shape : {false, true}) {
      const int64_t v = v_shape ? 2 : 3;
      std::set<std::pair<int, int64_t>> seen;
      for (int64_t vs = 0; vs < pp * v; ++vs) {
        const ChunkPlace p = place_of_virtual_stage(vs, pp, v, v_shape);
        EXPECT_EQ(virtual_stage_of(p.stage, p.chunk, pp, v_shape), vs);
        EXPECT_TRUE(seen.insert({p.stage, p.chunk}).second);
      }
      if (v_shape) EXPECT_EQ(place_of_virtual_stage(pp - 1, pp, 2, true).stage, place_of_virtual_stage(pp, pp, 2, true).stage);
    }
}

// The paper's comparison at pp 4 with 8 microbatches, every pass equally
// long: ZB-H1 idles less than 1F1B, ZB-V less than interleaved 1F1B (two
// chunks); and the timing agrees with the replay's order (it runs through).
TEST(ZeroBubblePlan, IdleTimeBelowOneFOneBAndInterleaved) {
  const PassCosts equal;
  const int pp = 4;
  const int64_t n = 8;
  const double one_f_one_b = time_plans(plans_of(PipelineSchedule::OneFOneB, pp, n, 1), 1, false, equal).idle_fraction;
  const double interleaved =
      time_plans(plans_of(PipelineSchedule::Interleaved, pp, n, 2), 2, false, equal).idle_fraction;
  const double h1 = time_plans(zero_bubble_plans(ZeroBubble::H1, pp, n), 1, false, equal).idle_fraction;
  const double v = time_plans(zero_bubble_plans(ZeroBubble::V, pp, n), 2, true, equal).idle_fraction;
  std::printf("idle at pp %d, %lld microbatches: 1F1B %.3f, interleaved(2) %.3f, ZB-H1 %.3f, ZB-V %.3f\n", pp,
              static_cast<long long>(n), one_f_one_b, interleaved, h1, v);
  // 1F1B's bubble with B + W = 2F: (pp - 1) / (n + pp - 1) of the round.
  EXPECT_NEAR(one_f_one_b, pipeline_bubble_fraction(pp, n, 1), 1e-9);
  EXPECT_LT(h1, one_f_one_b);
  EXPECT_LT(v, interleaved);
  EXPECT_LT(v, h1);
}


// Plans made on a timeline with the passes' real lengths: still deadlock-free
// within 1F1B's memory, and no slower on that timeline than the plans made
// with every pass equally long (what the greedy rule gains by knowing that a
// W is shorter or a B longer).
TEST(ZeroBubblePlan, PlansMadeWithPassCostsKeepTheRulesAndIdleNoMore) {
  const std::vector<PassCosts> costs = {{1, 1, 0.7}, {1, 1.07, 0.93}, {1, 1.3, 0.5}, {1, 2, 1}, {0.5, 1, 1}};
  double gained = 0;
  for (const PassCosts& c : costs)
    for (int pp : {2, 3, 4, 8})
      for (int64_t n_mb : {1, 2, 4, 8, 12}) {
        SCOPED_TRACE("pp " + std::to_string(pp) + ", " + std::to_string(n_mb) + " microbatches, costs " +
                     std::to_string(c.forward) + " : " + std::to_string(c.backward_input) + " : " +
                     std::to_string(c.backward_weight));
        for (ZeroBubble kind : {ZeroBubble::H1, ZeroBubble::V}) {
          const bool v_shape = kind == ZeroBubble::V;
          const int64_t v = v_shape ? 2 : 1;
          const auto made = zero_bubble_plans(kind, pp, n_mb, true, c);
          const Replay r = replay(made, v, v_shape, n_mb);
          ASSERT_TRUE(r.ok) << r.why;
          for (int s = 0; s < pp; ++s)
            EXPECT_LE(r.peak_alive[static_cast<size_t>(s)], v_shape ? 2 * pp : std::min<int64_t>(pp - s, n_mb));
          const double with_costs = time_plans(made, v, v_shape, c).makespan;
          const double equal = time_plans(zero_bubble_plans(kind, pp, n_mb), v, v_shape, c).makespan;
          EXPECT_LE(with_costs, equal * (1 + 1e-9));
          gained = std::max(gained, 1 - with_costs / equal);
        }
      }
  std::printf("largest round-time gain of cost-aware plans: %.3f\n", gained);
  for (auto [pp, n] : {std::pair<int, int64_t>{2, 4}, {4, 8}, {8, 16}})
    for (ZeroBubble kind : {ZeroBubble::H1, ZeroBubble::V}) {
      const PassCosts w07{1, 1, 0.7};
      const bool vs = kind == ZeroBubble::V;
      std::printf("pp %d, %lld mb, %s, W = 0.7 B: idle %.3f with costs, %.3f equal\n", pp, static_cast<long long>(n),
                  vs ? "V" : "H1", time_plans(zero_bubble_plans(kind, pp, n, true, w07), vs ? 2 : 1, vs, w07).idle_fraction,
                  time_plans(zero_bubble_plans(kind, pp, n), vs ? 2 : 1, vs, w07).idle_fraction);
    }
  EXPECT_GT(gained, 0);  // the costs change some plan for the better
  EXPECT_THROW(zero_bubble_plans(ZeroBubble::H1, 2, 4, true, {1, 0, 1}), std::exception);
}

// Any lengths make a plan (the timeline never stalls): a sweep of B and W
// against the forward, every count of microbatches up to 3pp.
TEST(ZeroBubblePlan, AnyPassCostsMakeAPlan) {
  for (double b = 0.4; b < 3.2; b += 0.37)
    for (double w = 0.2; w < 2.0; w += 0.29)
      for (int pp : {2, 3, 4})
        for (int64_t n_mb = 1; n_mb <= 3 * pp; ++n_mb)
          for (ZeroBubble kind : {ZeroBubble::H1, ZeroBubble::V}) {
            const PassCosts c{1, b, w};
            const bool v_shape = kind == ZeroBubble::V;
            std::vector<std::vector<PipeOp>> made;
            ASSERT_NO_THROW(made = zero_bubble_plans(kind, pp, n_mb, true, c))
                << (v_shape ? "V" : "H1") << " pp " << pp << ", " << n_mb << " mb, B " << b << ", W " << w;
            const Replay r = replay(made, v_shape ? 2 : 1, v_shape, n_mb);
            ASSERT_TRUE(r.ok) << r.why;
          }
}

}  // namespace
}  // namespace meshtrain
