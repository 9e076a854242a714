#pragma once
// Sampling parity for the multi-rank tests: the tokens a config's model
// draws once trained as one process, and once trained and sampled through
// its pipeline mesh, for the same prompts and options.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/parallel/pipeline_generate.h"
#include "meshtrain/sampling/generate.h"
#include "parity.h"

namespace meshtrain::test {

using Samples = std::vector<std::vector<int32_t>>;

// Two prompts and top-k sampling with a fixed seed: what both sides draw.
inline const Samples kPrompts = {{1, 5, 26}, {7, 3, 9}};
inline SampleOptions sample_options() {
  SampleOptions so;
  so.max_tokens = 12;
  so.top_k = 8;
  so.seed = 7;
  return so;
}

// cfg on a 1x1x1 mesh inside every rank (a sub-world of one rank): trained,
// then sampled.
inline Samples one_process_samples(Config cfg, const Samples& prompts, const SampleOptions& so) {
  cfg.device.n_device_axis = {1, 1, 1};
  cfg.name += "-one-rank" + std::to_string(test_runtime().rank());
  auto world = test_runtime().world();
  auto self = split_communicator(*world, world->rank(), 0);
  SessionOptions o;
  o.fresh = o.quiet = true;
  Trainer t(cfg, test_runtime(), o, self.get());
  t.train();
  CastScope casts(t.model().model->precision());
  return generate(*t.model().model, prompts, so);
}

// cfg on its own pipeline mesh: trained, then sampled stage by stage
// (parallel/pipeline_generate.h).
inline Samples pipeline_samples(const Config& cfg, const Samples& prompts, const SampleOptions& so) {
  SessionOptions o;
  o.fresh = o.quiet = true;
  Trainer t(cfg, test_runtime(), o);
  t.train();
  CastScope casts(t.model().model->precision());
  t.model().model->eval();
  Samples out = generate(cfg.model, at::Device(at::kCPU), pipeline_forward(t.model(), t.mesh()),
                         pipeline_share(t.model(), t.mesh()), prompts, so);
  t.model().model->train();
  return out;
}

}  // namespace meshtrain::test
