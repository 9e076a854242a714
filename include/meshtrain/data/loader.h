#pragma once
// Reads the shards of a folder in name order as one token stream. Every step
// takes the same global batch whatever the mesh: global_batch sequences of T+1
// tokens starting at the cursor (sequence i = tokens[pos + i*T, pos + (i+1)*T + 1)),
// and each dp rank keeps its contiguous share, so the data order never depends
// on dp (docs/ARCHITECTURE.md, "Invariants"). The cursor makes the stream resumable.
//
// Blends (data_config.datasets, Megatron's blended datasets): several such
// streams with weights. Global sequence i comes from the dataset whose share
// lags most behind its weight (argmax_d w_d * (i+1) - drawn_d, lowest d on
// ties), then T+1 tokens at that dataset's own cursor, which advances by T.
// The choice depends only on the counts in the cursor, so the order is
// the same on any mesh and resumes exactly from a checkpoint.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/data/shards.h"

namespace meshtrain {

struct Batch {
  at::Tensor inputs;   // int64 [B_local, T], CPU
  at::Tensor targets;  // inputs shifted by one token
};

// Where the next batch starts. A batch never spans two shards: when fewer than
// global_batch*T + 1 tokens are left, the stream moves to the next shard, and
// after the last one back to the first with epoch + 1.
struct Cursor {
  int64_t epoch = 0;
  int64_t shard = 0;
  int64_t position = 0;  // token offset in that shard
  // Blends only: each dataset's cursor and the sequences it has given.
  std::vector<Cursor> parts;
  std::vector<int64_t> drawn;
  bool operator==(const Cursor& o) const {
    return epoch == o.epoch && shard == o.shard && position == o.position && parts == o.parts &&
           drawn == o.drawn;
  }
};
void to_json(nlohmann::json& j, const Cursor& c);
void from_json(const nlohmann::json& j, Cursor& c);

// One dataset of a blend: its shard files in stream order and its weight.
struct DataSource {
  std::vector<std::string> files;
  ShardFormat format = ShardFormat::kLlmc;
  double weight = 1.0;
};

class DataLoader {
 public:
  // Every shard must hold at least global_batch*T + 1 tokens (checked here,
  // from the headers only); token ids must be < vocab_size (checked as read).
  DataLoader(const std::string& folder, int64_t T, int64_t global_batch, int dp_rank, int dp_size,
             int64_t vocab_size);
  // Explicit files in stream order, e.g. nanoGPT's single train.bin.
  DataLoader(std::vector<std::string> files, ShardFormat format, int64_t T, int64_t global_batch, int dp_rank,
             int dp_size, int64_t vocab_size);
  // A blend of two or more datasets (one source behaves as the constructor
  // above). Each shard must hold at least T + 1 tokens.
  DataLoader(std::vector<DataSource> sources, int64_t T, int64_t global_batch, int dp_rank, int dp_size,
             int64_t vocab_size);

  Batch next() { return next(global_batch_); }
  // A batch of global_batch sequences (<= the constructor's, a multiple of
  // dp): the batch-size rampup asks for smaller batches early in a run.
  Batch next(int64_t global_batch);
  Cursor cursor() const { return cursor_; }
  void restore(const Cursor& c);

  int64_t num_shards() const;
  // Tokens in all shards (one epoch holds slightly fewer: shard tails are skipped).
  int64_t total_tokens() const;

 private:
  struct Part {
    std::vector<std::string> paths;
    std::vector<int64_t> sizes;
    ShardFormat format;
    double weight;
    std::vector<ShardReader> readers;  // one per path, opened by the constructor
  };
  Batch next_blended(int64_t global_batch);

  std::vector<Part> parts_;  // blends: one per dataset
  std::vector<std::string> paths_;
  std::vector<int64_t> sizes_;  // tokens per shard, from the headers
  int64_t T_, global_batch_;
  int dp_rank_, dp_size_;
  int64_t vocab_size_;
  ShardFormat format_ = ShardFormat::kLlmc;
  Cursor cursor_;
  // Every shard as the constructor opened it (header only; no file stays
  // open): each read checks the file is still that one (shards.h), so data
  // replaced under a running train is an error, never silently other tokens.
  std::vector<ShardReader> readers_;
};

}  // namespace meshtrain
