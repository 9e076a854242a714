#pragma once
// The training loop, top to bottom as in llm.c: for each step, grad_step
// accumulation rounds through the pipeline, gradient sync, clip, NaN policy,
// update, log; every checkpoint_steps: evaluate, checkpoint, sample.
#include <chrono>
#include <memory>
#include <string>

#include "meshtrain/ckpt/checkpointer.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/run_lock.h"
#include "meshtrain/core/watchdog.h"
#include "meshtrain/data/data_tokenizer.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/prefetcher.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/parallel/pipeline.h"
#include "meshtrain/parallel/optimizer.h"
#include "meshtrain/parallel/zero.h"
#include "meshtrain/metrics/metrics.h"
#include "meshtrain/train/test_hooks.h"

namespace meshtrain {

struct TrainOptions {
  bool fresh = false;              // ignore existing checkpoints in the run dir (never deleting unreadable ones)
  std::string checkpoint;          // load this checkpoint dir instead of the newest
  bool require_checkpoint = false; // no checkpoint to load is an error (eval, generate)
  bool load_data_cursor = true;    // restore the loaders' positions from the checkpoint
  // Resume a checkpoint whose data was made by another tokenizer (a warning
  // instead of the refusal; train --allow-tokenizer-change).
  bool allow_tokenizer_change = false;
  bool quiet = false;              // no per-step console lines
  // The performance model (`bench --device meta`): parameters and activations
  // are meta tensors (shapes only) and batches are synthetic, so no data
  // folder is read; one rank, no checkpoints.
  bool meta = false;
  // Armed by main before MPI initialisation (launch_env.h), so the start-up
  // is watched from the first moment; the Trainer beats it. Null: the Trainer
  // arms its own (tests, bench).
  Watchdog* watchdog = nullptr;
  // train: rank 0 writes a probe file into the run dir and every rank must
  // read it (shared_run_dir.h) before any checkpoint is loaded or trained.
  bool check_shared_run_dir = false;
  // The Hugging Face directory this run's weights started from (--init-from-hf),
  // recorded in every checkpoint so later runs take the model from it.
  std::string init_from_hf;
  // A test seam: every backward pass runs on a thread other than the
  // forward's, as CUDA's autograd engine runs it (RoundSpec::backward_thread).
  bool backward_thread = false;
};

// Step statistics reduced over the whole mesh (identical on every rank). A
// step leaves them on the device (`device`, `grad_norm_t`); read() brings
// them to the host in one copy, which is the step's only device-to-host sync
// and happens when the step is logged.
struct StepStats {
  double loss = 0;       // mean cross-entropy over the step's tokens (+ nothing else)
  double aux_loss = 0;   // mean per-sequence aux loss (sum over MoE layers)
  double z_loss = 0;
  double dropped_fraction = 0;
  std::vector<std::vector<double>> expert_fraction;  // per MoE layer (global index order), per expert
  double tokens = 0;
  double grad_norm = 0;              // global gradient norm before clipping (after apply_update)
  double pipeline_wait_seconds = 0;  // most time any rank spent blocked on a pipeline neighbour
  int64_t batch_size = 0;  // sequences per accumulation round (rampup_batch_size)
  int64_t seq_len = 0;     // tokens per sequence (seq_len_warmup)

  // Device side, until read(): [ce_sum, aux_sum, z_sum, dropped, assigned,
  // expert tokens per (layer, expert)] fp64, summed over the mesh.
  at::Tensor device;
  at::Tensor grad_norm_t;  // 0-dim fp64 (apply_update)
  int64_t n_layers = 0, n_experts = 0;
  bool read_done = false;
  // Fills the doubles above from the device values (one host read); idempotent.
  void read();
};

class Trainer {
 public:
  // world: the ranks this run spans (default: the whole MPI world); tests pass
  // a sub-world to run a reference mesh inside a multi-rank job.
  Trainer(const Config& cfg, Runtime& runtime, TrainOptions opts = {}, const Communicator* world = nullptr);
  ~Trainer();

  // Trains until cfg.training_steps; returns the last step's mean loss.
  double train();
  // Mean validation loss over eval_steps batches (identical on every rank).
  double evaluate();
  // Samples inference_config.prompt (ending at end-of-text unless
  // inference_config.stop_at_eot is false); returns prompt + sample, prints nothing.
  std::string sample();

  int64_t step() const { return step_; }
  const Config& config() const { return cfg_; }
  Mesh& mesh() { return *mesh_; }
  ParallelModel& model() { return pm_; }
  // The optimizer (AdamW or ZeRO-1 behind one interface).
  Optimizer& optim() { return *opt_; }
  // The replicated AdamW (zero_stage 0); zero_stage 1 has none.
  AdamW& optimizer() {
    MT_CHECK(opt_->adamw(), "zero_stage 1: the optimizer is the ZeroOptimizer (Trainer::zero_optimizer())");
    return *opt_->adamw();
  }
  ZeroOptimizer* zero_optimizer() { return dynamic_cast<ZeroOptimizer*>(opt_.get()); }
  // Parameter, gradient and optimizer-state bytes this rank holds now (plan.h models them).
  ResidentBytes resident_bytes() const { return opt_->resident_bytes(); }
  // Sequences trained on so far (drives the batch-size rampup; saved in checkpoints).
  int64_t consumed_samples() const { return consumed_samples_; }
  // Losses of every step trained by this object, in order (for tests).
  const std::vector<double>& losses() const { return losses_; }
  // Global gradient norms of those steps (before clipping).
  const std::vector<double>& grad_norms() const { return grad_norms_; }

  // One optimizer step (grad_step rounds); public for tests.
  StepStats train_step();
  // After train_step: global grad norm, clipping, optimizer update (AdamW or
  // ZeRO-1) with learning rate lr, all on the device: a non-finite loss or
  // norm skips the update there (nan_policy is applied when the step is
  // read). Sets s.grad_norm_t; reads nothing.
  void apply_update(StepStats& s, double lr);
  void save_checkpoint();
  // Throws Stopped on every rank when any rank received a stop signal
  // (core/stop_signal.h); collective. Public for loops outside train() (bench).
  void stop_point(const std::string& during);

 private:
  // DeepSeek-V3's auxiliary-loss-free balancing (router_bias_update_rate).
  void update_score_bias(const StepStats& s);
  // Registers the checkpoint components (train/components.h) and loads the
  // checkpoint the options ask for (train/checkpointing.cpp).
  void setup_checkpointing();
  void resume();
  void check_resumed_config(const std::string& dir, const nlohmann::json& trainer_state) const;
  void check_resumed_tokenizer(const std::string& dir, const nlohmann::json& trainer_state) const;
  void apply_header(const nlohmann::json& trainer_state);
  // Locks the run dir (one training per run dir) and opens metrics.jsonl; train() calls it.
  void open_run_dir();
  // The stop signal any rank received (0: none); collective.
  int stop_agreed();
  // This round's batch; following: the next round's size, read ahead.
  Batch next_train_batch(int64_t global_batch, int64_t following);
  void warn_starved_experts(const StepStats& s);
  std::string progress_suffix() const;
  // Where the weights come from, for messages: a checkpoint, or the untrained model.
  std::string weights_source() const;
  StepStats reduce_stats(const RoundSums& sums, double global_tokens, int64_t seq_len);
  // Reads s and applies nan_policy to a non-finite step (throws for "stop").
  void read_step(StepStats& s);
  void log_step(const StepStats& s, double lr, double grad_norm, double seconds);

  Config cfg_;
  Runtime& runtime_;
  bool is_rank0_ = true;
  TrainOptions opts_;
  std::unique_ptr<Watchdog> own_watchdog_;  // first: it watches the start-up too
  Watchdog* watchdog_ = nullptr;           // opts_.watchdog or own_watchdog_
  std::unique_ptr<Mesh> mesh_;
  ParallelModel pm_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;
  std::unique_ptr<BatchPrefetcher> prefetcher_;  // over train_loader_; declared after it, destroyed before it
  std::unique_ptr<Tokenizer> tokenizer_;
  DataTokenizer data_tokenizer_;  // which tokenizer made the data (checked at start-up, saved, checked on resume)
  std::unique_ptr<RunLock> run_lock_;      // rank 0, while training
  std::unique_ptr<MetricsLogger> metrics_;  // opened by train()
  std::unique_ptr<Checkpointer> checkpointer_;
  std::vector<std::unique_ptr<Stateful>> components_;
  at::Device device_;
  TestHooks test_hooks_;
  int64_t step_ = 0;
  int64_t consumed_samples_ = 0;
  int64_t nan_skips_in_a_row_ = 0;  // nan_policy skip gives up at cfg.max_nan_skips
  std::vector<double> losses_;
  std::vector<double> grad_norms_;
  std::chrono::steady_clock::time_point train_start_;
  int64_t train_start_step_ = -1;
  std::string weights_from_;  // the checkpoint loaded at start-up ("" none)
  std::vector<int64_t> starved_steps_;  // per (MoE layer, expert): consecutive steps with no token
};

}  // namespace meshtrain
