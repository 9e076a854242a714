#pragma once
// The pipeline benchmarks' measurement (pp_test, interleaved_test,
// zero_bubble_test): a schedule's seconds per round and its bubble, the
// time blocked in pipeline send/recv over the round, worst rank.
#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <cstdint>

#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/pipeline.h"

namespace meshtrain::test {

struct RoundTiming {
  double seconds = 0;  // per round
  double bubble = 0;   // blocked share of the round
  std::array<double, 3> passes{};  // split plans: seconds in forward, B and W, summed over ranks
};

// cfg built on mesh, one warm-up round, then `rounds` timed rounds of
// `inputs` (their own targets). Seconds and bubble are the median round's
// (worst rank in each round), so one descheduled round on a shared machine
// does not move them. Collective over the world.
inline RoundTiming time_rounds(const Config& cfg, Mesh& mesh, Communicator& world, const at::Tensor& inputs,
                               const RoundSpec& spec, int64_t rounds) {
  const auto pm_owned = build_parallel_model(cfg, mesh);
  ParallelModel& pm = *pm_owned;
  run_round(pm, mesh, cfg, inputs, inputs, spec);  // warm-up
  world.barrier();
  at::Tensor per_round = at::zeros({2, rounds}, at::kDouble);  // seconds, blocked seconds
  std::array<double, 3> passes{};
  for (int64_t r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const RoundSums sums = run_round(pm, mesh, cfg, inputs, inputs, spec);
    per_round[0][r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    per_round[1][r] = sums.wait_seconds();
    const std::array<double, 3> p = sums.pass_seconds();
    for (size_t i = 0; i < 3; ++i) passes[i] += p[i];
  }
  world.all_reduce(per_round, ReduceOp::Max);
  const at::Tensor seconds = per_round[0].median(), bubble = (per_round[1] / per_round[0]).median();
  at::Tensor summed = at::tensor({passes[0], passes[1], passes[2]}, at::kDouble);
  world.all_reduce(summed, ReduceOp::Sum);
  return {seconds.item<double>(), bubble.item<double>(),
          {summed[0].item<double>(), summed[1].item<double>(), summed[2].item<double>()}};
}

}  // namespace meshtrain::test
