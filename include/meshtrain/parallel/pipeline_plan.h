#pragma once
// A pipeline schedule as data: the ordered list of compute and point-to-point
// steps one stage takes over a round's microbatches. The executor
// (schedules.cpp) runs it; tests replay every stage's plan under blocking
// (rendezvous) send/recv semantics to prove it cannot deadlock.
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

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
};

// The steps of `stage` (of pp) for n_mb microbatches. schedule: "gpipe" |
// "1f1b"; backward false gives the forward-only (evaluation) plan. Sends and
// receives a stage has no peer for (first/last stage) are left out.
std::vector<PipeOp> pipeline_plan(const std::string& schedule, int stage, int pp, int64_t n_mb, bool backward);

// Microbatches whose activations a plan holds at once (forward done,
// backward not yet; forward-only plans hold one at a time).
int64_t plan_peak_live(const std::vector<PipeOp>& plan);

const char* step_name(PipeStep s);

}  // namespace meshtrain
