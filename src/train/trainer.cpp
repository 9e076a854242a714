#include "meshtrain/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>

#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"
#include "meshtrain/core/log.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/train/evaluate.h"
#include "meshtrain/sampling/generate.h"
#include "meshtrain/train/sample.h"

namespace meshtrain {

Trainer::Trainer(const Config& cfg, Runtime& runtime, SessionOptions opts, const Communicator* world)
    : session_(cfg, runtime, std::move(opts), world) {}

Trainer::~Trainer() = default;

AdamW& Trainer::adamw() {
  AdamW* a = session_.data_parallel().adamw();
  MT_CHECK(a, "the optimizer state is sharded (ZeRO-1 or FSDP): there is no AdamW over whole parameters ",
           "(Trainer::data_parallel(), Trainer::zero_optimizer())");
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
      require_checkpoint_root(cfg.run_dir());  // checkpoints/ and its `latest`
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

void Trainer::finish_step(PendingStep& p, double seconds) {
  const Config& cfg = config();
  StepStats& s = p.stats;
  s.read();  // the step's one host read: every step is logged (metrics.jsonl)
  if (std::isfinite(s.loss) && std::isfinite(s.grad_norm)) {
    nan_skips_in_a_row_ = 0;
  } else {
    // The update was skipped on the device (found_inf).
    MT_CHECK(cfg.nan_policy != NanPolicy::Stop, "non-finite loss or gradient at step ", p.number, " (loss ", s.loss,
             ", grad norm ", s.grad_norm, "); nan_policy is \"stop\"");
    ++nan_skips_in_a_row_;
    spdlog::warn("step {}: non-finite loss ({}) or grad norm ({}): update skipped (nan_policy skip, {} of at most {} "
                 "in a row)", p.number, s.loss, s.grad_norm, nan_skips_in_a_row_, cfg.max_nan_skips);
    // Skipping forever would burn the run's budget on a diverged model and exit 0.
    MT_CHECK(nan_skips_in_a_row_ < cfg.max_nan_skips, "nan_policy skip: steps ", p.number + 1 - nan_skips_in_a_row_,
             " to ", p.number, " (", nan_skips_in_a_row_, " in a row, max_nan_skips) all had a non-finite loss or ",
             "gradient; giving up. The checkpoints saved so far are untouched; lower lr.max_lr or resume from an ",
             "earlier checkpoint");
  }
  losses_.push_back(s.loss);
  grad_norms_.push_back(s.grad_norm);
  const nlohmann::json stragglers = straggler_->after_step(p.number, seconds, mesh().cpu_world(), session_.flight());
  log_->step(p.number, s, p.lr, seconds, /*pipeline=*/mesh().shape().pp > 1, stragglers);
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
  if (const int sig = session_.stop_agreed()) {
    spdlog::warn("stop requested (signal {}) before the first step: nothing trained, nothing to save", sig);
    return std::nan("");
  }
  straggler_ = std::make_unique<StragglerReport>(cfg.straggler_threshold, cfg.log_every);
  if (cfg.device.cuda_graphs && !graph_) graph_ = std::make_unique<StepGraph>(session_);
  straggler_->restart(session_.flight());
  using Clock = std::chrono::steady_clock;
  std::optional<PendingStep> pending;  // the step enqueued last, not read yet
  auto mark = Clock::now();            // where the last step logged ended
  // A step's time ends when its work was done: on the CPU, which computes
  // as it issues, when it was issued; on a GPU, when reading its statistics
  // returns if their copy (queued right behind the step's last kernel) had
  // not landed yet, else (a host-bound run) about when it was issued. (The time between two reads gave the second of a
  // checkpoint's two back-to-back reads no time at all: millions of
  // tokens/s.)
  auto finish = [&] {
    const bool busy = !pending->stats.landed();
    pending->stats.read();
    const auto end = busy ? Clock::now() : std::max(pending->issued, mark);
    finish_step(*pending, std::chrono::duration<double>(end - mark).count());
    mark = end;
    StepStats read = std::move(pending->stats);
    pending.reset();
    return read;
  };
  while (step() < total) {
    if (!pending) mark = Clock::now();  // nothing in flight: this step's time starts now
    session_.flight().set_step(step() + 1);
    const double lr = learning_rate(cfg.lr, step());
    const auto after_update = [&] { session_.test_hooks().after_update(step() + 1, model()); };
    StepStats s;
    if (graph_) {
      s = graph_->step(lr, after_update);  // eager, checked, captured or replayed
    } else {
      s = meshtrain::train_step(session_);
      meshtrain::apply_update(session_, s, lr);
      after_update();
      update_score_bias(session_, s);  // on the device: no read needed
    }
    // The statistics' copy to the host is enqueued now, behind this step's
    // work: reading them after the next step is enqueued waits for this
    // step alone (its event also ends the step's time, below).
    s.start_read();
    ++session_.progress().step;
    const auto issued = Clock::now();
    // A background save (async_checkpoint) is committed once every rank wrote it.
    const double committed = session_.commit_written_checkpoint();
    // The previous step's read waits for its kernels while this step's are queued.
    if (pending) finish();
    pending = PendingStep{std::move(s), lr, step(), issued};
    if (committed > 0)
      log_->checkpoint(step(), {{"checkpoint_blocked_seconds", committed}, {"checkpoint_committed", true}});
    const int64_t n = step();
    const bool boundary = n % cfg.checkpoint_steps == 0 || n == total;
    // Agreeing on a stop is a host all-reduce over every rank: every
    // stop_check_steps steps (a stop waits at most that many steps) and at
    // every checkpoint, so a stop never waits past a save it could use.
    const int stop = boundary || n % cfg.stop_check_steps == 0 ? session_.stop_agreed() : 0;
    // Evaluation, saving and stopping see every step before them logged.
    if (boundary || stop) {
      if (after_step(finish(), stop) != 0) break;
    }
  }
  return losses_.empty() ? std::nan("") : losses_.back();
}

int Trainer::after_step(const StepStats& s, int stop) {
  const Config& cfg = config();
  const int64_t n = step();
  Watchdog& watchdog = session_.watchdog();
  const bool boundary = n % cfg.checkpoint_steps == 0 || n == cfg.training_steps;
  // A stop skips what is left to do but the save, so it is prompt and loses no step.
  if (boundary && !stop) {
    watchdog.beat("evaluation at step " + std::to_string(n));
    try {
      const Evaluation val = evaluate(session_);
      if (std::isfinite(val.loss)) log_->validation(n, s.loss, val);
    } catch (const Stopped& e) {
      stop = e.signal_number();
      spdlog::warn("{}: the evaluation of step {} is dropped", e.what(), n);
    }
  }
  if (boundary || stop) {
    watchdog.beat("saving the checkpoint of step " + std::to_string(n));
    // A stop and the end wait for the save (and the one in flight before it).
    const CheckpointCost cost = session_.save_checkpoint_in_loop(/*finish=*/stop || n == cfg.training_steps);
    log_->checkpoint(n, {{"checkpoint_blocked_seconds", cost.blocked}, {"checkpoint_wait_seconds", cost.waited},
                         {"checkpoint_async", cost.background}});
  }
  straggler_->restart(session_.flight());  // evaluation and saving are not step time
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
