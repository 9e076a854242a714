#pragma once
// A pipeline schedule as data: the ordered list of compute and point-to-point
// steps one stage takes over a round's microbatches. The executor
// (schedules.cpp) runs it; tests replay every stage's plan under blocking
// (rendezvous) send/recv semantics to prove it cannot deadlock.
#include <cstdint>
#include <vector>

#include "meshtrain/config/choices.h"

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
};

struct PipeOp {
  PipeStep step;
  int64_t microbatch;
  int64_t chunk = 0;  // this rank's layer chunk (virtual stage chunk * pp + stage); 0 unless interleaved
};

// The steps of `stage` (of pp) for n_mb microbatches. schedule: gpipe | 1f1b |
// interleaved (v chunks of layers per stage, Megatron's interleaved 1F1B;
// v = 1 is 1f1b); backward false gives the forward-only
// (evaluation) plan. Sends and receives a stage has no peer for (first/last
// virtual stage) are left out. The interleaved training plan needs n_mb to be
// a multiple of pp, as Megatron's.
// v: layer chunks per stage; interleaved must name it (v = 1 there is 1f1b),
// gpipe and 1f1b take 0 or 1.
std::vector<PipeOp> pipeline_plan(PipelineSchedule schedule, int stage, int pp, int64_t n_mb, bool backward,
                                  int64_t v = 0);

// The bubble the schedule's idealised timeline leaves (forward and backward
// of every microbatch taking equal time per virtual stage): (pp - 1) / (v *
// n_mb) of the ideal compute time (Megatron's formula; gpipe and 1f1b: v = 1),
// as a fraction of the whole round: (pp - 1) / (v * n_mb + pp - 1).
double pipeline_bubble_fraction(int pp, int64_t n_mb, int64_t v);

// Microbatches whose activations a plan holds at once (forward done,
// backward not yet; forward-only plans hold one at a time), counted per chunk
// under the interleaved schedule (a chunk's microbatch holds 1/v of the
// stage's layers).
int64_t plan_peak_live(const std::vector<PipeOp>& plan);

const char* step_name(PipeStep s);

// Whether the executor runs plan steps a and b (adjacent, a first) as one
// send_recv: one is a send and the other a receive. Grouping them only lets
// the receive match earlier and keeps each direction's message order, so a
// plan that cannot deadlock with blocking send/recv cannot with the pairs
// either (the plan tests replay both ways).
bool paired_transfers(const PipeOp& a, const PipeOp& b);

}  // namespace meshtrain
