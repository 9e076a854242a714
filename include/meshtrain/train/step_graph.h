#pragma once
// device_config.cuda_graphs: the training step as one CUDA graph, as
// Megatron's full-iteration graphs: one step's device work -- every round's
// forward and backward, the gradient norm, clipping, AdamW and the MoE
// balancing -- is captured once and every later step replays it, so the GPU
// runs the step's kernels back to back with no host launch time between them.
//
//   step 1      eager (lazy initialisation: caches, workspaces, optimizer state)
//   steps 2, 3  eager, each recorded (perf/graph_safety.h): a host read of
//               device memory, or memory used otherwise than the step before,
//               ends the run with an error naming it
//   step 4      captured, then replayed (GPU)
//   steps 5..   the step's batches copied into the graph's inputs, replayed
//
// The learning rate is a device scalar written before each step (AdamW reads
// it there, optim/adamw.h LearningRate), dropout draws from the CUDA
// generator's graph-safe Philox offsets, and the graph's statistics tensors
// are rewritten by every replay: read them (StepStats::start_read) before the
// next step. What a graph cannot replay is refused at start-up
// (config/validate.cpp). On the CPU there are no graphs: the check runs the
// same way, then every step stays eager, so the CPU tests guard what a GPU
// would capture. A GPU machine runs every step on a stream of its own, the
// caller's stream waiting for it.
#include <memory>
#include <string>

#include "meshtrain/train/session.h"
#include "meshtrain/train/step.h"

namespace meshtrain {

class StepGraph {
 public:
  // s: a session whose config has device_config.cuda_graphs (validated).
  explicit StepGraph(Session& s);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // One training step with learning rate lr, as the trainer runs one
  // (begin_step, the next batches, run_step, apply_update, update_score_bias),
  // eager, checked, captured or replayed. after_update runs after the eager
  // steps' update (the tests' hooks; a replay runs no host code).
  StepStats step(double lr, const std::function<void()>& after_update = {});

  // How the last step ran: "eager", "checked", "captured" or "replayed".
  const std::string& last_mode() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The steps that run eagerly before the capture, and the last of them that
// is checked against the one before.
constexpr int64_t kGraphEagerSteps = 3;

}  // namespace meshtrain
