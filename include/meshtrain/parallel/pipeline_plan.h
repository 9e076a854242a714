#pragma once
// A pipeline schedule as data: the ordered list of compute and point-to-point
// steps one stage takes over a round's microbatches. The executor
// (schedules.cpp) runs it; tests replay every stage's plan under blocking
// (rendezvous) send/recv semantics to prove it cannot deadlock.
#include <cstdint>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

// Peers are taken modulo pp: under the interleaved schedule the last rank's
// chunk c feeds the first rank's chunk c + 1 (and gradients flow back).
enum class PipeStep {
  RecvForward,   // activation from stage - 1
  Forward,
  SendForward,   // activation to stage + 1
  RecvBackward,  // gradient from stage + 1
  Backward,
  SendBackward,  // gradient to stage - 1
  // Zero-bubble schedules split Backward in two: B, the input gradient (what
  // the stage before waits for), and W, the weight gradients (schedulable
  // anywhere after B).
  BackwardInput,
  BackwardWeight,
};

struct PipeOp {
  PipeStep step;
  int64_t microbatch;
  int64_t chunk = 0;  // this rank's layer chunk (virtual stage chunk * pp + stage); 0 unless interleaved
};

// Relative costs of a chunk's forward, input-gradient and weight-gradient
// passes (the timeline zero-bubble plans are made on, and the idle time a
// plan leaves).
struct PassCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;
};

// The costs a run's zero-bubble plans are made with: pipeline_pass_costs,
// else the model's FLOP ratios (model/flops.h), B plus a forward under full
// recomputation (B recomputes the layer's forward first). Every rank derives
// the same from the config, so the plans stay one global order.
PassCosts pipeline_pass_costs(const Config& cfg);

// The steps of `stage` (of pp) for n_mb microbatches. schedule: gpipe | 1f1b |
// interleaved (v chunks of layers per stage, Megatron's interleaved 1F1B;
// v = 1 is 1f1b); backward false gives the forward-only
// (evaluation) plan. Sends and receives a stage has no peer for (first/last
// virtual stage) are left out. The interleaved training plan needs n_mb to be
// a multiple of pp, as Megatron's.
// v: layer chunks per stage; interleaved must name it (v = 1 there is 1f1b),
// gpipe and 1f1b take 0 or 1.
// costs: the zero-bubble schedules' (the others' order does not depend on them).
std::vector<PipeOp> pipeline_plan(PipelineSchedule schedule, int stage, int pp, int64_t n_mb, bool backward,
                                  int64_t v = 0, const PassCosts& costs = {});

// The bubble the schedule's idealised timeline leaves (forward and backward
// of every microbatch taking equal time per virtual stage): (pp - 1) / (v *
// n_mb) of the ideal compute time (Megatron's formula; gpipe and 1f1b: v = 1),
// as a fraction of the whole round: (pp - 1) / (v * n_mb + pp - 1).
double pipeline_bubble_fraction(int pp, int64_t n_mb, int64_t v);

// Microbatches whose activations a plan holds at once (forward done,
// backward not yet, a split backward's W not yet: B leaves the weight
// gradients' operands to it; forward-only plans hold one at a time), counted per chunk
// under the interleaved schedule (a chunk's microbatch holds 1/v of the
// stage's layers).
int64_t plan_peak_live(const std::vector<PipeOp>& plan);

const char* step_name(PipeStep s);

// ---- zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism",
// ICLR 2024): each backward split into B and W (PipeStep::BackwardInput /
// BackwardWeight), W placed where 1F1B leaves the stage idle.
//   H1: one layer chunk per stage, 1F1B's activation memory (at most
//       pp - stage microbatches between their forward and their W); a stage
//       runs a B whose gradient is here, else a forward within that bound,
//       else a waiting W: the W passes fill the time 1F1B idles.
//   V:  two chunks per stage in a V: stage s holds virtual stages s and
//       2pp - 1 - s (the data goes down the stages and back up; the turn at
//       the last stage is local, the loss is on stage 0); the same rule, the
//       later chunk first, at most 2pp chunk halves alive a stage (1F1B's
//       memory).
// The plans are made on an idealised timeline (costs below) on which a
// transfer happens when neither stage computes, so, as the interleaved
// plans, every stage's plan is the projection of one global order of events
// and cannot deadlock under blocking send/recv.
enum class ZeroBubble { H1, V };

// Every stage's plan (index: stage) for n_mb microbatches over pp stages;
// backward false: the forwards alone, in the same layout (evaluation).
// costs: the passes' relative lengths on the timeline the plans are made on.
std::vector<std::vector<PipeOp>> zero_bubble_plans(ZeroBubble kind, int pp, int64_t n_mb, bool backward = true,
                                                   const PassCosts& costs = {});

// Where virtual stage `vs` (0 .. pp*v - 1, in data order) lives: the rank and
// its chunk. v_shape: the V layout (v = 2), else the interleaved one (chunk
// c of rank r is virtual stage c * pp + r; v = 1 is plain 1F1B).
struct ChunkPlace {
  int stage;
  int64_t chunk;
};
ChunkPlace place_of_virtual_stage(int64_t vs, int pp, int64_t v, bool v_shape);
int64_t virtual_stage_of(int stage, int64_t chunk, int pp, bool v_shape);

// How long plans take on the idealised timeline: every compute costs its
// pass's cost (Backward: B + W), a transfer is a rendezvous of its two ends
// and costs nothing. idle: the fraction of stage-time no compute covers
// (the bubble), from the plans themselves.
struct PlanTiming {
  double makespan = 0;
  double idle_fraction = 0;
};
PlanTiming time_plans(const std::vector<std::vector<PipeOp>>& plans, int64_t v, bool v_shape, const PassCosts& costs);

// Whether the executor runs plan steps a and b (adjacent, a first) as one
// send_recv: one is a send and the other a receive. Grouping them only lets
// the receive match earlier and keeps each direction's message order, so a
// plan that cannot deadlock with blocking send/recv cannot with the pairs
// either (the plan tests replay both ways).
bool paired_transfers(const PipeOp& a, const PipeOp& b);

}  // namespace meshtrain
