// Pipeline plans as data, no MPI: every stage's step list replayed together
// under blocking (rendezvous) send/recv with NCCL's matching (per pair of
// ranks, in order, tags ignored) never deadlocks, every message meets the
// receive it is meant for, and every microbatch's forward and backward of
// every virtual stage runs exactly once, after its inputs. Also the layer
// layout of the interleaved schedule and its idealised bubble.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/parallel/pipeline_plan.h"

namespace meshtrain {
namespace {

struct Replay {
  bool ok = true;
  std::string why;
  double makespan = 0;  // forward 1/v, backward 2/v per chunk, transfers free
  std::vector<int64_t> peak_live;
};

bool is_send(PipeStep s) { return s == PipeStep::SendForward || s == PipeStep::SendBackward; }
bool is_recv(PipeStep s) { return s == PipeStep::RecvForward || s == PipeStep::RecvBackward; }

std::string describe(int stage, const PipeOp& op) {
  return "stage " + std::to_string(stage) + " " + step_name(op.step) + "(mb " + std::to_string(op.microbatch) +
         ", chunk " + std::to_string(op.chunk) + ")";
}

// paired: the executor's grouping (paired_transfers): a send and a receive
// next to each other are posted together and may complete in either order.
Replay replay(PipelineSchedule schedule, int pp, int64_t v, int64_t n_mb, bool backward, bool paired = false) {
  Replay r;
  std::vector<std::vector<PipeOp>> plans;
  for (int s = 0; s < pp; ++s) plans.push_back(pipeline_plan(schedule, s, pp, n_mb, backward, v));
  auto fail = [&](const std::string& why) {
    r.ok = false;
    r.why = why;
    return r;
  };
  auto peer_of = [&](int s, PipeStep k) {
    const bool downstream = k == PipeStep::SendForward || k == PipeStep::RecvBackward;
    return downstream ? (s + 1) % pp : (s + pp - 1) % pp;
  };
  // Per stage: (what, microbatch, chunk) done; what: 'F' forward, 'B'
  // backward, 'a' activation received, 'g' gradient received.
  using Done = std::tuple<char, int64_t, int64_t>;
  std::vector<std::set<Done>> done(static_cast<size_t>(pp));
  std::vector<double> clock(static_cast<size_t>(pp), 0.0);
  std::vector<size_t> pc(static_cast<size_t>(pp), 0);
  // The transfers a stage has posted: plan[pc], and plan[pc + 1] when paired;
  // which of the two are done.
  std::vector<std::array<bool, 2>> posted_done(static_cast<size_t>(pp), {false, false});
  auto width = [&](size_t si) -> size_t {
    const auto& plan = plans[si];
    const size_t i = pc[si];
    return paired && i + 1 < plan.size() && paired_transfers(plan[i], plan[i + 1]) ? 2 : 1;
  };
  auto advance_if_done = [&](size_t si) {
    const size_t w = width(si);
    for (size_t k = 0; k < w; ++k)
      if (!posted_done[si][k]) return;
    pc[si] += w;
    posted_done[si] = {false, false};
  };
  std::vector<int64_t> live(static_cast<size_t>(pp), 0);
  r.peak_live.assign(static_cast<size_t>(pp), 0);
  const double unit = 1.0 / static_cast<double>(v);
  auto first_virtual = [&](int s, int64_t c) { return s == 0 && c == 0; };
  auto last_virtual = [&](int s, int64_t c) { return s == pp - 1 && c == v - 1; };

  for (;;) {
    bool progress = false, finished = true;
    for (int s = 0; s < pp; ++s) {
      const size_t si = static_cast<size_t>(s);
      auto& plan = plans[si];
      auto& i = pc[si];
      // Compute steps run alone, after their inputs.
      while (i < plan.size() && !is_send(plan[i].step) && !is_recv(plan[i].step)) {
        const PipeOp& op = plan[i];
        if (op.chunk < 0 || op.chunk >= v) return fail(describe(s, op) + ": no such chunk");
        const bool fwd = op.step == PipeStep::Forward;
        if (done[si].count({fwd ? 'F' : 'B', op.microbatch, op.chunk})) return fail(describe(s, op) + " runs twice");
        if (fwd && !first_virtual(s, op.chunk) && !done[si].count({'a', op.microbatch, op.chunk}))
          return fail(describe(s, op) + " before its activation arrived");
        if (!fwd && !done[si].count({'F', op.microbatch, op.chunk}))
          return fail(describe(s, op) + " before its forward");
        if (!fwd && !last_virtual(s, op.chunk) && !done[si].count({'g', op.microbatch, op.chunk}))
          return fail(describe(s, op) + " before its gradient arrived");
        done[si].insert({fwd ? 'F' : 'B', op.microbatch, op.chunk});
        clock[si] += (fwd ? 1.0 : 2.0) * unit;
        if (fwd) r.peak_live[si] = std::max(r.peak_live[si], ++live[si]);
        if (!fwd || !backward) --live[si];
        ++i;
        progress = true;
      }
      if (i >= plan.size()) continue;
      finished = false;
      const size_t start = i, mine = width(si);
      for (size_t k = 0; k < mine && pc[si] == start; ++k) {
        const PipeOp& op = plan[start + k];
        if (posted_done[si][k] || !is_send(op.step)) continue;  // a receive waits for its sender's turn
        const int peer = peer_of(s, op.step);
        const size_t pi = static_cast<size_t>(peer);
        if (pp == 1) return fail(describe(s, op) + " has no peer");
        if (pc[pi] >= plans[pi].size()) return fail(describe(s, op) + ": stage " + std::to_string(peer) + " has ended");
        // The receive from this rank the peer has posted, if any.
        size_t slot = 2;
        for (size_t q = 0; q < width(pi) && slot == 2; ++q) {
          const PipeOp& cand = plans[pi][pc[pi] + q];
          if (!posted_done[pi][q] && is_recv(cand.step) && peer_of(peer, cand.step) == s) slot = q;
        }
        if (slot == 2) continue;  // the peer is busy elsewhere: wait
        const PipeOp& got = plans[pi][pc[pi] + slot];
        // The receive the send meets (NCCL ignores tags: it is the next one
        // from this rank) must be the one meant for it.
        const bool fwd = op.step == PipeStep::SendForward;
        const int64_t chunk = fwd ? op.chunk + (s == pp - 1 ? 1 : 0) : op.chunk - (s == 0 ? 1 : 0);
        const PipeStep want = fwd ? PipeStep::RecvForward : PipeStep::RecvBackward;
        if (got.step != want || got.microbatch != op.microbatch || got.chunk != chunk)
          return fail(describe(s, op) + " meets " + describe(peer, got));
        if (!done[si].count({fwd ? 'F' : 'B', op.microbatch, op.chunk}))
          return fail(describe(s, op) + " before its compute");
        done[pi].insert({fwd ? 'a' : 'g', got.microbatch, got.chunk});
        clock[si] = clock[pi] = std::max(clock[si], clock[pi]);
        posted_done[si][k] = true;
        posted_done[pi][slot] = true;
        advance_if_done(si);
        if (pi != si) advance_if_done(pi);
        progress = true;
      }
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
  // Everything ran: every microbatch through every virtual stage.
  for (int s = 0; s < pp; ++s)
    for (int64_t mb = 0; mb < n_mb; ++mb)
      for (int64_t c = 0; c < v; ++c) {
        if (!done[static_cast<size_t>(s)].count({'F', mb, c}))
          return fail("stage " + std::to_string(s) + " never runs the forward of mb " + std::to_string(mb) +
                      ", chunk " + std::to_string(c));
        if (backward && !done[static_cast<size_t>(s)].count({'B', mb, c}))
          return fail("stage " + std::to_string(s) + " never runs the backward of mb " + std::to_string(mb) +
                      ", chunk " + std::to_string(c));
      }
  r.makespan = *std::max_element(clock.begin(), clock.end());
  return r;
}

TEST(PipelinePlan, GpipeAnd1f1bNeverDeadlock) {
  for (PipelineSchedule schedule : {PipelineSchedule::Gpipe, PipelineSchedule::OneFOneB})
    for (bool backward : {true, false})
      for (int pp = 1; pp <= 8; ++pp)
        for (int64_t n_mb = 1; n_mb <= 12; ++n_mb) {
          const Replay r = replay(schedule, pp, 1, n_mb, backward);
          ASSERT_TRUE(r.ok) << schedule << " pp " << pp << " n_mb " << n_mb << " backward " << backward << ": "
                            << r.why;
          for (int s = 0; s < pp; ++s) {
            const int64_t want = !backward                              ? 1
                                 : schedule == PipelineSchedule::Gpipe ? n_mb
                                                                       : std::min<int64_t>(pp - s, n_mb);
            EXPECT_EQ(r.peak_live[static_cast<size_t>(s)], want) << schedule << " stage " << s << " of " << pp;
            EXPECT_EQ(plan_peak_live(pipeline_plan(schedule, s, pp, n_mb, backward)), want);
          }
        }
}

// The executor's send_recv pairs (paired_transfers) keep every plan
// deadlock-free, and the plans do pair transfers.
TEST(PipelinePlan, PairedTransfersNeverDeadlock) {
  int64_t pairs = 0;
  for (PipelineSchedule schedule :
       {PipelineSchedule::Gpipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved})
    for (bool backward : {true, false})
      for (int pp = 2; pp <= 8; ++pp)
        for (int64_t v = 1; v <= (schedule == PipelineSchedule::Interleaved ? 4 : 1); ++v)
          for (int64_t groups : {1, 2, 3}) {
            const int64_t n_mb = groups * pp;
            const Replay r = replay(schedule, pp, v, n_mb, backward, /*paired=*/true);
            ASSERT_TRUE(r.ok) << schedule << " pp " << pp << " v " << v << " n_mb " << n_mb << " backward "
                              << backward << ": " << r.why;
            for (int s = 0; s < pp; ++s) {
              const auto plan = pipeline_plan(schedule, s, pp, n_mb, backward, v);
              for (size_t i = 0; i + 1 < plan.size(); ++i) pairs += paired_transfers(plan[i], plan[i + 1]) ? 1 : 0;
            }
          }
  EXPECT_GT(pairs, 0);
}

TEST(PipelinePlan, InterleavedNeverDeadlocksAndRunsEverythingOnce) {
  for (int pp = 2; pp <= 8; ++pp)
    for (int64_t v = 1; v <= 4; ++v) {
      for (int64_t groups : {1, 2, 3, 5}) {
        const int64_t n_mb = groups * pp;
        const Replay r = replay(PipelineSchedule::Interleaved, pp, v, n_mb, true);
        ASSERT_TRUE(r.ok) << "pp " << pp << " v " << v << " n_mb " << n_mb << ": " << r.why;
        for (int s = 0; s < pp; ++s) {
          // Megatron's warm-up forwards plus the one of the steady state
          // (v = 1 is 1f1b: pp - stage).
          const int64_t warmup = v == 1 ? pp - s - 1 : 2 * (pp - s - 1) + (v - 1) * pp;
          const int64_t want = std::min<int64_t>(n_mb * v, warmup + 1);
          EXPECT_EQ(r.peak_live[static_cast<size_t>(s)], want) << "pp " << pp << " v " << v << " stage " << s;
          EXPECT_EQ(plan_peak_live(pipeline_plan(PipelineSchedule::Interleaved, s, pp, n_mb, true, v)), want);
        }
      }
      // Evaluation: forward-only rounds of any size.
      for (int64_t n_mb = 1; n_mb <= 2 * pp + 1; ++n_mb) {
        const Replay r = replay(PipelineSchedule::Interleaved, pp, v, n_mb, false);
        ASSERT_TRUE(r.ok) << "forward-only pp " << pp << " v " << v << " n_mb " << n_mb << ": " << r.why;
      }
    }
}

TEST(PipelinePlan, InterleavedWithOneChunkIs1f1b) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int64_t n_mb = 1; n_mb <= 10; ++n_mb)
      for (int s = 0; s < pp; ++s)
        for (bool backward : {true, false}) {
          const auto a = pipeline_plan(PipelineSchedule::Interleaved, s, pp, n_mb, backward, 1);
          const auto b = pipeline_plan(PipelineSchedule::OneFOneB, s, pp, n_mb, backward, 1);
          ASSERT_EQ(a.size(), b.size());
          for (size_t i = 0; i < a.size(); ++i)
            EXPECT_TRUE(a[i].step == b[i].step && a[i].microbatch == b[i].microbatch && a[i].chunk == b[i].chunk);
        }
}

// The plans' timeline (a chunk's forward 1/v, backward 2/v, transfers free
// but blocking): the idle share of a round is Megatron's bubble,
// (pp - 1) / (v * n_mb + pp - 1), falling with v.
TEST(PipelinePlan, InterleavedBubbleFallsWithVirtualStages) {
  for (int pp : {2, 4, 8})
    for (int64_t n_mb : {int64_t{pp}, int64_t{2 * pp}, int64_t{4 * pp}}) {
      double previous = 1.0;
      for (int64_t v = 1; v <= 4; ++v) {
        const Replay r = replay(PipelineSchedule::Interleaved, pp, v, n_mb, true);
        ASSERT_TRUE(r.ok) << r.why;
        const double busy = 3.0 * static_cast<double>(n_mb);
        const double bubble = 1.0 - busy / r.makespan;
        const double theory = pipeline_bubble_fraction(pp, n_mb, v);
        EXPECT_LT(bubble, previous) << "pp " << pp << " n_mb " << n_mb << " v " << v;
        EXPECT_NEAR(bubble, theory, 1e-9) << "pp " << pp << " n_mb " << n_mb << " v " << v;
        previous = bubble;
      }
    }
}

TEST(PipelinePlan, InterleavedRefusesWhatMegatronRefuses) {
  const PipelineSchedule il = PipelineSchedule::Interleaved;
  EXPECT_THROW(pipeline_plan(il, 0, 4, 6, true, 2), Error);  // 6 microbatches, pp 4
  EXPECT_NO_THROW(pipeline_plan(il, 0, 4, 6, false, 2));     // evaluation takes any count
  EXPECT_THROW(pipeline_plan(PipelineSchedule::OneFOneB, 0, 2, 4, true, 2), Error);  // chunks need interleaved
  EXPECT_THROW(pipeline_plan(il, 0, 2, 4, true, 0), Error);
  try {
    pipeline_plan(il, 1, 4, 6, true, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of pp = 4"), std::string::npos) << e.what();
  }
}

// Megatron's layout: chunk c of rank r is virtual stage c * pp + r.
TEST(PipelinePlan, InterleavedLayerLayout) {
  const auto ranges = partition_stages(16, 4, 2);
  ASSERT_EQ(ranges.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const auto chunks = ranges[static_cast<size_t>(r)].chunks();
    ASSERT_EQ(chunks.size(), 2u);
    for (int64_t c = 0; c < 2; ++c) {
      EXPECT_EQ(chunks[static_cast<size_t>(c)].first, (c * 4 + r) * 2) << "rank " << r << " chunk " << c;
      EXPECT_EQ(chunks[static_cast<size_t>(c)].end, (c * 4 + r) * 2 + 2) << "rank " << r << " chunk " << c;
    }
    EXPECT_EQ(ranges[static_cast<size_t>(r)].has_embedding, r == 0);
    EXPECT_EQ(ranges[static_cast<size_t>(r)].has_head, r == 3);
  }
  EXPECT_EQ(ranges[1].layers(), (std::vector<int64_t>{2, 3, 10, 11}));
  // v = 1 keeps the uneven contiguous split.
  const auto uneven = partition_stages(5, 2, 1);
  EXPECT_EQ(uneven[0].layers(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(uneven[0].later_chunks.empty());
  EXPECT_THROW(partition_stages(12, 4, 2), Error);  // 12 layers in 8 virtual stages
  try {
    partition_stages(12, 4, 2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("virtual_stages"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
