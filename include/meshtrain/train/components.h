#pragma once
// The run's checkpoint components (ckpt/stateful.h), one per part of the run
// that has state to keep, in torchtitan's manner: the trainer registers them
// with its Checkpointer and never flattens state by hand. Another piece of
// state (e.g. a CUDA generator: RngState over it) is one more component.
//   "model"  ModelState      parameters, sharded as the mesh holds them
//   "optim"  OptimizerState  AdamW moments per parameter (whole under ZeRO-1/FSDP) and the step count
// Only the rank that writes a tensor holds it on the host (pinned on CUDA);
// sharded state is gathered to it alone (parallel/checkpoint_writer.h).
//   "data"   DataState       the train and val loaders' cursors
//   "rng"    RngState        a torch generator's state
#include <ATen/core/Generator.h>

#include "meshtrain/ckpt/stateful.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/parallelize.h"
#include "meshtrain/parallel/zero.h"

namespace meshtrain {

// Tensors "<global name>", each chunk written by one owner (dp rank 0, tp rank 0
// for replicated ones, never a tied copy); state() is collective under
// zero_stage 3 (parameters gathered from their shards to the writers). vocab: the model's vocabulary, so
// embedding/head tables saved under another tp's padding still load.
class ModelState : public Stateful {
 public:
  ModelState(ParallelModel& pm, Mesh& mesh, int64_t vocab) : pm_(pm), mesh_(mesh), vocab_(vocab) {}
  ComponentState state() const override;
  void load_state(const ComponentReader& in) override;

 private:
  ParallelModel& pm_;
  Mesh& mesh_;
  int64_t vocab_;
};

// Tensors "exp_avg.<global name>" and "exp_avg_sq.<global name>", laid out as
// the parameter, so they read back on any dp and any zero_stage; value "steps".
// A checkpoint lacking a moment is incomplete: loading throws rather than
// resuming with zeroed moments.
class OptimizerState : public Stateful {
 public:
  OptimizerState(ParallelModel& pm, Mesh& mesh, int64_t vocab, DataParallel& opt)
      : pm_(pm), mesh_(mesh), vocab_(vocab), opt_(opt) {}
  ComponentState state() const override;  // collective under ZeRO-1/FSDP (moments to their writers)
  void load_state(const ComponentReader& in) override;

 private:
  ParallelModel& pm_;
  Mesh& mesh_;
  int64_t vocab_;
  DataParallel& opt_;  // it defines where the moments live
};

// Values "train_cursor", "val_cursor": positions in the global token stream, so
// they hold on any mesh.
class DataState : public Stateful {
 public:
  DataState(DataLoader& train, DataLoader& val) : train_(train), val_(val) {}
  ComponentState state() const override;
  void load_state(const ComponentReader& in) override;

 private:
  DataLoader& train_;
  DataLoader& val_;
};

// Value "state": the generator's state bytes (rank 0's; every rank gets them back).
class RngState : public Stateful {
 public:
  explicit RngState(at::Generator gen) : gen_(std::move(gen)) {}
  ComponentState state() const override;
  void load_state(const ComponentReader& in) override;

 private:
  at::Generator gen_;
};

}  // namespace meshtrain
