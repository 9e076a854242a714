#include "meshtrain/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"
#include "meshtrain/core/log.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/train/evaluate.h"
#include "meshtrain/train/generate.h"
#include "meshtrain/train/sample.h"

namespace meshtrain {

Trainer::Trainer(const Config& cfg, Runtime& runtime, SessionOptions opts, const Communicator* world)
    : session_(cfg, runtime, std::move(opts), world) {}

Trainer::~Trainer() = default;

AdamW& Trainer::adamw() {
  AdamW* a = session_.optimizer().adamw();
  MT_CHECK(a, "zero_stage ", config().zero_stage, ": the optimizer state is sharded, there is no replicated AdamW ",
           "(Trainer::optimizer(), Trainer::zero_optimizer())");
  return *a;
}

void Trainer::open_run_dir() {
  if (log_) return;
  const Config& cfg = config();
  const bool rank0 = session_.is_rank0();
  // Rank 0 writes the run dir; the others learn whether it could lock it.
  std::string error;
  if (rank0) {
    try {
      run_lock_ = std::make_unique<RunLock>(cfg.run_dir());
      // Found now, not at the first save after hours of training.
      require_writable_folder(cfg.run_dir() + "/checkpoints", "checkpoint folder");
      require_writable_folder(cfg.run_dir() + "/tb", "TensorBoard folder");
      const std::string metrics = cfg.run_dir() + "/metrics.jsonl", kind = non_regular_kind(metrics);
      MT_CHECK(kind.empty() || kind == "missing", "the metrics file ", metrics, " is ", kind,
               ", not a regular file; move it away or choose another output_dir / name");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  at::Tensor failed = at::full({1}, static_cast<int64_t>(!error.empty()), at::kLong);
  mesh().cpu_world().all_reduce(failed, ReduceOp::Max);
  MT_CHECK(failed.item<int64_t>() == 0, rank0 ? error : "rank 0 could not lock the run dir " + cfg.run_dir());
  // Only after the lock: opening repairs metrics.jsonl, which must not race another run.
  // One row per step: rows an earlier attempt logged after the step resumed
  // from are dropped, and --fresh sets the old file aside.
  log_ = std::make_unique<StepLog>(cfg, rank0, session_.options().quiet,
                                   MetricsStart{step(), session_.options().fresh});
}

void Trainer::read_step(StepStats& s) {
  const Config& cfg = config();
  s.read();
  if (std::isfinite(s.loss) && std::isfinite(s.grad_norm)) {
    nan_skips_in_a_row_ = 0;
    return;
  }
  // The update was skipped on the device (found_inf); step() + 1: the number
  // this step gets in the log and metrics.jsonl.
  MT_CHECK(cfg.nan_policy != NanPolicy::Stop, "non-finite loss or gradient at step ", step() + 1, " (loss ", s.loss,
           ", grad norm ", s.grad_norm, "); nan_policy is \"stop\"");
  ++nan_skips_in_a_row_;
  spdlog::warn("step {}: non-finite loss ({}) or grad norm ({}): update skipped (nan_policy skip, {} of at most {} "
               "in a row)", step() + 1, s.loss, s.grad_norm, nan_skips_in_a_row_, cfg.max_nan_skips);
  // Skipping forever would burn the run's budget on a diverged model and exit 0.
  MT_CHECK(nan_skips_in_a_row_ < cfg.max_nan_skips, "nan_policy skip: steps ", step() + 2 - nan_skips_in_a_row_,
           " to ", step() + 1, " (", nan_skips_in_a_row_, " in a row, max_nan_skips) all had a non-finite loss or ",
           "gradient; giving up. The checkpoints saved so far are untouched; lower lr.max_lr or resume from an ",
           "earlier checkpoint");
}

double Trainer::train() {
  open_run_dir();
  const Config& cfg = config();
  const int64_t total = cfg.training_steps;
  if (step() >= total) {
    spdlog::info("run {} is already at step {} of {}: nothing to train", cfg.run_dir(), step(), total);
    return losses_.empty() ? std::nan("") : losses_.back();
  }
  spdlog::info("training {} -> {} steps, {} tokens per step, run dir {}", step(), total,
               cfg.data.train_batch_size * cfg.grad_step * cfg.data.T, cfg.run_dir());
  double last = std::nan("");
  if (const int sig = session_.stop_agreed()) {
    spdlog::warn("stop requested (signal {}) before the first step: nothing trained, nothing to save", sig);
    return last;
  }
  while (step() < total) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = learning_rate(cfg.lr, step());
    StepStats s = meshtrain::train_step(session_);
    meshtrain::apply_update(session_, s, lr);
    session_.test_hooks().after_update(step() + 1, model());
    read_step(s);  // the step's one host read: every step is logged (metrics.jsonl)
    update_score_bias(session_, s);
    ++session_.progress().step;
    last = s.loss;
    losses_.push_back(s.loss);
    grad_norms_.push_back(s.grad_norm);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_->step(step(), s, lr, secs, /*pipeline=*/mesh().shape().pp > 1);
    if (after_step(s) != 0) break;
  }
  return last;
}

int Trainer::after_step(const StepStats& s) {
  const Config& cfg = config();
  const int64_t n = step();
  Watchdog& watchdog = session_.watchdog();
  int stop = session_.stop_agreed();
  const bool boundary = n % cfg.checkpoint_steps == 0 || n == cfg.training_steps;
  // A stop skips what is left to do but the save, so it is prompt and loses no step.
  if (boundary && !stop) {
    watchdog.beat("evaluation at step " + std::to_string(n));
    try {
      const double val = evaluate(session_);
      if (std::isfinite(val)) log_->validation(n, s.loss, val);
    } catch (const Stopped& e) {
      stop = e.signal_number();
      spdlog::warn("{}: the evaluation of step {} is dropped", e.what(), n);
    }
  }
  if (boundary || stop) {
    watchdog.beat("saving the checkpoint of step " + std::to_string(n));
    session_.save_checkpoint();
  }
  if (stop) {
    spdlog::warn("stop requested (signal {}): step {} saved, exiting", stop, n);
    return stop;
  }
  if (boundary && (cfg.sample_every == 0 ? n == cfg.training_steps : n % cfg.sample_every == 0)) {
    watchdog.beat("sampling at step " + std::to_string(n));
    try {
      const std::string text = sample(session_);
      if (!text.empty()) spdlog::info("sample: {}", text);
    } catch (const Stopped& e) {
      spdlog::warn("{}: step {} is saved, exiting", e.what(), n);
      return e.signal_number();
    } catch (const NonFiniteLogits& e) {
      // Every rank sees the same logits, so all warn alike: the sample is
      // a report on the run, and the training itself succeeded.
      spdlog::warn("the sample at step {} failed (training is unaffected; the checkpoint is saved): {}", n, e.what());
    }
  }
  return 0;
}

}  // namespace meshtrain
