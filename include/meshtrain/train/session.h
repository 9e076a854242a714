#pragma once
// The one assembly of a run, in a fixed order, for every subcommand that
// needs a model (train, eval, generate, bench, bench --device meta):
//   device -> mesh -> data (tokenizer check, loaders) -> model (single-device,
//   sharded through the layer factory) -> parallelize (stages, recomputation,
//   DDP buckets or FSDP) -> optimizer -> checkpointer (+ resume)
// Each subcommand takes what it needs from it: train runs the loop
// (train/trainer.h), eval calls evaluate() (train/evaluate.h), generate
// sample() (train/sample.h), bench timed steps (train/step.h).
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpointer.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/watchdog.h"
#include "meshtrain/data/data_tokenizer.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/prefetcher.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/dist/runtime.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/train/test_hooks.h"

namespace meshtrain {

struct SessionOptions {
  bool fresh = false;              // ignore existing checkpoints in the run dir (never deleting unreadable ones)
  std::string checkpoint;          // load this checkpoint dir instead of the newest
  bool require_checkpoint = false; // no checkpoint to load is an error (eval, generate)
  // Resume a checkpoint whose data was made by another tokenizer (a warning
  // instead of the refusal; train --allow-tokenizer-change).
  bool allow_tokenizer_change = false;
  bool quiet = false;              // no per-step console lines (Trainer)
  // The performance model (`bench --device meta`): parameters and activations
  // are meta tensors (shapes only) and batches are synthetic, so no data
  // folder is read; one rank, no checkpoints.
  bool meta = false;
  // Armed by main before MPI initialisation (launch_env.h), so the start-up
  // is watched from the first moment. Null: the Session arms its own (tests, bench).
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

// What a save of the training loop cost it: seconds of training lost.
struct CheckpointCost {
  double blocked = 0;  // all of it: waiting, gathering, copying, (sync) writing, committing
  double waited = 0;   // of which waiting for the background save still in flight
  bool background = false;  // async_checkpoint: the files are written on a thread
};

// Where the run stands: saved in every checkpoint's header.
struct RunProgress {
  int64_t step = 0;              // optimizer steps taken
  int64_t consumed_samples = 0;  // sequences trained on (drives the batch-size rampup)
};

class Session {
 public:
  // world: the ranks this run spans (default: the whole MPI world); tests pass
  // a sub-world to run a reference mesh inside a multi-rank job.
  Session(const Config& cfg, Runtime& runtime, SessionOptions opts = {}, const Communicator* world = nullptr);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Config& config() const { return cfg_; }
  const SessionOptions& options() const { return opts_; }
  const at::Device& device() const { return device_; }
  bool is_rank0() const { return is_rank0_; }
  int world_rank() const { return world_rank_; }
  Mesh& mesh() { return *mesh_; }
  ParallelModel& model() { return *pm_; }
  // The one owner of the gradients and of the update: replicated, ZeRO-1 or
  // FSDP behind one interface (parallel/data_parallel.h).
  DataParallel& data_parallel() { return *pm_->data_parallel; }
  Watchdog& watchdog() { return *watchdog_; }
  // This rank's collective flight recorder (core/flight_recorder.h).
  FlightRecorder& flight() { return *flight_; }
  const TestHooks& test_hooks() const { return test_hooks_; }
  RunProgress& progress() { return progress_; }
  const RunProgress& progress() const { return progress_; }
  // Null on the meta device (no data is read).
  DataLoader* val_loader() { return val_loader_.get(); }
  BatchPrefetcher* prefetcher() { return prefetcher_.get(); }
  // The data's tokenizer.json, or null when data_dir has none.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // The checkpoint the weights were loaded from at start-up ("" none) and the step it held.
  const std::string& weights_from() const { return weights_from_; }
  int64_t loaded_step() const { return loaded_step_; }

  // Throws Stopped on every rank when any rank received a stop signal
  // (core/stop_signal.h); collective over the mesh's world.
  void stop_point(const std::string& during);
  // The stop signal any rank received (0: none); collective.
  int stop_agreed();
  // Saves the run's state at progress().step (train/checkpointing.cpp); collective.
  void save_checkpoint();
  // The training loop's save at progress().step: save_checkpoint(), or with
  // async_checkpoint a background save (ckpt/background_save.h) after waiting
  // for the one in flight; finish: commit it before returning (a stop, the
  // end of training). Collective.
  CheckpointCost save_checkpoint_in_loop(bool finish);
  // Commits the background save in flight when every rank has written it;
  // returns the seconds that took (0 when nothing was committed). Collective
  // while a save is in flight: every rank calls it after every step.
  double commit_written_checkpoint();

 private:
  void build_data();
  void build_model();
  // Registers the checkpoint components (train/components.h) and loads the
  // checkpoint the options ask for (train/checkpointing.cpp).
  void setup_checkpointing();
  void resume();
  void check_resumed_config(const std::string& dir, const nlohmann::json& trainer_state) const;
  void check_resumed_tokenizer(const std::string& dir, const nlohmann::json& trainer_state) const;
  void apply_header(const nlohmann::json& trainer_state);
  nlohmann::json checkpoint_header() const;

  Config cfg_;
  SessionOptions opts_;
  at::Device device_;
  bool is_rank0_ = true;
  int world_rank_ = 0;
  TestHooks test_hooks_;
  std::unique_ptr<Watchdog> own_watchdog_;  // first: it watches the start-up too
  Watchdog* watchdog_ = nullptr;           // opts_.watchdog or own_watchdog_
  // Before the mesh: its communicators report to it until they are destroyed.
  std::unique_ptr<FlightRecorder> flight_;
  bool flight_written_ = false;  // at the first stop agreed
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;
  std::unique_ptr<BatchPrefetcher> prefetcher_;  // over train_loader_; declared after it, destroyed before it
  std::unique_ptr<Tokenizer> tokenizer_;
  DataTokenizer data_tokenizer_;  // which tokenizer made the data (checked at start-up, saved, checked on resume)
  std::unique_ptr<ParallelModel> pm_;  // made by parallelize(), never moved
  std::unique_ptr<Checkpointer> checkpointer_;
  std::vector<std::unique_ptr<Stateful>> components_;
  RunProgress progress_;
  std::string weights_from_;
  int64_t loaded_step_ = 0;
};

}  // namespace meshtrain
