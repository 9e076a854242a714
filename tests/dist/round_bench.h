#pragma once
// The pipeline benchmarks' measurement (pp_test, interleaved_test,
// zero_bubble_test): a schedule's seconds per round and its bubble, the
// time blocked in pipeline send/recv over the round, worst rank.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>

#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/pipeline.h"

namespace meshtrain::test {

struct RoundTiming {
  double seconds = 0;  // per round
  double bubble = 0;   // blocked share of the round
};

// cfg built on mesh, one warm-up round, then `rounds` timed rounds of
// `inputs` (their own targets). Collective over the world.
inline RoundTiming time_rounds(const Config& cfg, Mesh& mesh, Communicator& world, const at::Tensor& inputs,
                               const RoundSpec& spec, int64_t rounds) {
  const auto pm_owned = build_parallel_model(cfg, mesh);
  ParallelModel& pm = *pm_owned;
  run_round(pm, mesh, cfg, inputs, inputs, spec);  // warm-up
  world.barrier();
  double wait = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < rounds; ++r) wait += run_round(pm, mesh, cfg, inputs, inputs, spec).wait_seconds();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  at::Tensor stats = at::tensor({seconds / static_cast<double>(rounds), wait / seconds}, at::kDouble);
  world.all_reduce(stats, ReduceOp::Max);
  return {stats[0].item<double>(), stats[1].item<double>()};
}

}  // namespace meshtrain::test
