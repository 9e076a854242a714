#pragma once
// Sharded checkpoints of named tensors (model and optimizer state), saved by
// every rank of any mesh and readable on any other mesh.
//
// run_dir/checkpoints/
//   step_00000100/            complete checkpoints only (a save writes
//     rank_00000.safetensors  step_00000100.tmp-* and renames it when done)
//     rank_00001.safetensors  the shards each rank wrote, keyed "name@index"
//     manifest.json           per tensor: global shape, dtype, split, shard -> file/key;
//                             per file: size and CRC32C
//     trainer_state.json      step, RNG, data cursor, config: whatever the trainer passes
//   latest                    "step_00000100", the newest save (for people and tools;
//                             a resume picks the newest complete step itself)
//
// ckpt/ knows tensors and their shard layout, never model types: components
// (ckpt/stateful.h) give their state as NamedTensors, telling which rank writes
// each shard, and the Checkpointer (ckpt/checkpointer.h) loops over them.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/dist/comm.h"

namespace meshtrain {

// A tensor that is chunk `shard` of `num_shards` equal chunks along split_dim
// of a tensor of global_shape; split_dim -1 means the whole tensor (replicated).
struct ShardSpec {
  std::vector<int64_t> global_shape;
  int64_t split_dim = -1;
  int64_t shard = 0;
  int64_t num_shards = 1;
  // An optional second split along another dim (expert parallelism: experts
  // over expert_parallel on dim 0, hidden units over tp on split_dim): the
  // chunk is also chunk outer_shard of outer_shards along outer_dim. -1: none.
  int64_t outer_dim = -1;
  int64_t outer_shard = 0;
  int64_t outer_shards = 1;
  // The manifest numbers shards outer_shard * num_shards + shard.
  int64_t index() const { return outer_shard * num_shards + shard; }
  int64_t total_shards() const { return outer_shards * num_shards; }
};

// The local shape the spec describes; throws when the split doesn't divide evenly.
std::vector<int64_t> shard_shape(const ShardSpec& spec, const std::string& name = "tensor");

// write=false: a replica of a shard that another rank writes (the trainer sets
// write on exactly one owner per shard, e.g. dp rank 0); its tensor may be
// undefined, as only the writer brings a shard to the host.
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  ShardSpec spec;
  bool write = true;
};

// Collective over `world`; returns on every rank once the checkpoint is
// complete on disk and `latest` names it. A failure on any rank throws on every
// rank and leaves the previous checkpoints untouched. Re-saving a step replaces
// it. Keeps the newest max_to_keep checkpoints (<= 0: keep all). Checkpoints
// named in `keep` (directory names, e.g. ones the run could not read) are
// never deleted nor overwritten: a re-save of their step moves them aside.
void save_checkpoint(const std::string& run_dir, int64_t step, const std::vector<NamedTensor>& local,
                     const nlohmann::json& trainer_state, Communicator& world, int64_t max_to_keep,
                     const std::vector<std::string>& keep = {});

// The checkpoint directories of a run (complete names only, no staging dirs),
// newest step first, unverified.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Why a run must not be pointed at `dir` although it may hold a manifest,
// from its folder name; "" when it may be. A staging dir (step_N.tmp-*: a
// save in progress, or the leftover of a killed one, which the next save of
// the run removes), a checkpoint set aside as *.superseded (an abandoned
// history) or *.unreadable (kept as evidence): none is ever read.
std::string set_aside_checkpoint(const std::string& dir);

// The newest complete checkpoint whose files all match their sizes and
// checksums, by step (`latest` may lag behind after a crash). Invalid ones are
// skipped with a warning. Returns the checkpoint directory.
std::optional<std::string> find_latest_checkpoint(const std::string& run_dir);

class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& ckpt_dir);  // parses manifest and headers; no checksums

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  int64_t world_size() const { return world_size_; }
  const nlohmann::json& trainer_state() const { return trainer_state_; }
  const nlohmann::json& manifest() const { return manifest_; }
  std::vector<std::string> names() const;
  bool has(const std::string& name) const;
  std::vector<int64_t> global_shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;

  // The chunk `want` describes, cut from the global tensor whatever mesh saved
  // it: resharding for free. Reads only the saved shards that overlap the chunk.
  // A floating-point chunk holding NaN or inf is refused, naming the tensor.
  at::Tensor read(const std::string& name, const ShardSpec& want) const;
  at::Tensor read(const std::string& name) const;  // the whole tensor

  void verify() const;  // sizes and checksums of every file; throws naming the file

 private:
  const nlohmann::json& tensor_entry(const std::string& name) const;
  void check_finite(const std::string& name, const at::Tensor& t) const;

  std::string dir_;
  int64_t step_ = 0;
  int64_t world_size_ = 0;
  nlohmann::json manifest_;
  nlohmann::json trainer_state_;
  std::map<std::string, SafetensorsFile> files_;
};

// One unsharded safetensors file with every tensor whose name starts with
// prefix_filter (all when empty), loadable by Python's safetensors.
void export_checkpoint(const std::string& ckpt_dir, const std::string& out_file,
                       const std::string& prefix_filter = "");

// Step, world size, each tensor (global shape, dtype, split) and a summary of
// the trainer state, for `meshtrain checkpoint inspect`.
std::string inspect_checkpoint(const std::string& ckpt_dir);

}  // namespace meshtrain
