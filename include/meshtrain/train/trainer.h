#pragma once
// The training loop, top to bottom as in llm.c: for each step, one optimizer
// step (train/step.h: grad_step accumulation rounds through the pipeline,
// gradient sync, clip, NaN skip, update), its log line (train/step_log.h);
// every checkpoint_steps: evaluate, checkpoint, sample. A step's statistics
// are read (and logged) after the next step is enqueued, except before an
// evaluation, a checkpoint, a stop or the end. Everything the loop
// runs on is assembled by the Session (train/session.h).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/core/run_lock.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/zero.h"
#include "meshtrain/train/session.h"
#include "meshtrain/train/step.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/step_log.h"
#include "meshtrain/train/straggler.h"

namespace meshtrain {

class Trainer {
 public:
  // world: the ranks this run spans (default: the whole MPI world); tests pass
  // a sub-world to run a reference mesh inside a multi-rank job.
  Trainer(const Config& cfg, Runtime& runtime, SessionOptions opts = {}, const Communicator* world = nullptr);
  ~Trainer();

  // Trains until cfg.training_steps; returns the last step's mean loss.
  double train();

  Session& session() { return session_; }
  int64_t step() const { return session_.progress().step; }
  const Config& config() const { return session_.config(); }
  Mesh& mesh() { return session_.mesh(); }
  ParallelModel& model() { return session_.model(); }
  DataParallel& data_parallel() { return session_.data_parallel(); }
  // The replicated AdamW (zero_stage 0); zero_stage 1 and FSDP have none.
  AdamW& adamw();
  ZeroDataParallel* zero_optimizer() { return dynamic_cast<ZeroDataParallel*>(&session_.data_parallel()); }
  // Parameter, gradient and optimizer-state bytes this rank holds now (plan.h models them).
  ResidentBytes resident_bytes() const { return const_cast<Session&>(session_).data_parallel().resident_bytes(); }
  // Sequences trained on so far (drives the batch-size rampup; saved in checkpoints).
  int64_t consumed_samples() const { return session_.progress().consumed_samples; }
  // Losses and global gradient norms (before clipping) of every step trained by this object, in order (tests).
  // device_config.cuda_graphs: the captured step (null before train() or without graphs).
  const StepGraph* step_graph() const { return graph_.get(); }
  const std::vector<double>& losses() const { return losses_; }
  const std::vector<double>& grad_norms() const { return grad_norms_; }

  // One step's forward, backward and update without logging (train/step.h); for tests.
  StepStats train_step() { return meshtrain::train_step(session_); }
  void apply_update(StepStats& s, double lr) { meshtrain::apply_update(session_, s, lr); }
  void save_checkpoint() { session_.save_checkpoint(); }

 private:
  // Locks the run dir (one training per run dir) and opens metrics.jsonl.
  void open_run_dir();
  // A step whose statistics are not read yet: step n is read once step n+1
  // is enqueued, so the device never waits for the host between steps.
  struct PendingStep {
    StepStats stats;
    double lr = 0;
    int64_t number = 0;  // the step's number in the log (1-based)
    // When the host had issued all of the step's work (with the statistics'
    // event: where the step's time ends, see train()).
    std::chrono::steady_clock::time_point issued;
  };
  // Reads the step (its one host read), applies nan_policy to a non-finite
  // step (throws for "stop") and logs it; seconds: since the previous step's log.
  void finish_step(PendingStep& p, double seconds);
  // After step `step`, stop: the signal agreed (0: none): evaluation,
  // checkpoint and sample where due; returns the stop signal (0: go on).
  int after_step(const StepStats& s, int stop);

  Session session_;
  std::unique_ptr<RunLock> run_lock_;  // rank 0, while training
  std::unique_ptr<StepLog> log_;       // opened by train()
  std::unique_ptr<StragglerReport> straggler_;  // made by train()
  std::unique_ptr<StepGraph> graph_;            // device_config.cuda_graphs: made by train()
  int64_t nan_skips_in_a_row_ = 0;     // nan_policy skip gives up at cfg.max_nan_skips
  std::vector<double> losses_;
  std::vector<double> grad_norms_;
};

}  // namespace meshtrain
