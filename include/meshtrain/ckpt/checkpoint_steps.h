#pragma once
// The steps of save_checkpoint, public so that one process can play several
// ranks in tests (and tools can write checkpoints without a communicator):
//   rank 0: make_staging_dir          -> barrier
//   every rank: write_rank_shards     -> RankShards, all-gathered to rank 0
//   rank 0: build_manifest + commit_checkpoint (rename, latest, prune)
// grouped as stage_checkpoint (collective) -> try_write_rank_shards (local:
// what a background save runs on its own thread) -> commit_rank_shards
// (collective), the three calls save_checkpoint makes.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"

namespace meshtrain {

std::string checkpoints_root(const std::string& run_dir);    // run_dir/checkpoints
std::string checkpoint_dir_name(int64_t step);                // step_00000100
// Train's start-up check of what every save writes: run_dir/checkpoints is
// (made) a writable folder, and `latest` (with the `latest.tmp` it is written
// through) is a file or missing; throws naming the path in the way, so a run
// never trains for hours towards a save that cannot complete.
void require_checkpoint_root(const std::string& run_dir);
// The step of a complete checkpoint's directory name; nullopt for anything else
// (staging *.tmp-* dirs, `latest`, stray files).
std::optional<int64_t> parse_checkpoint_dir_name(const std::string& name);

// What one rank wrote into the staging directory.
struct RankShards {
  struct Shard {
    std::string name;   // tensor name
    std::string key;    // key in the rank's file: name@index
    std::string dtype;  // safetensors name: F32, BF16, ...
    ShardSpec spec;
  };
  int rank = 0;
  std::string file;  // relative to the checkpoint dir; empty when the rank wrote nothing
  int64_t bytes = 0;
  std::string checksum;
  std::vector<Shard> shards;
  std::string error;  // non-empty: this rank failed, and with it the whole save
};
nlohmann::json to_json(const RankShards& r);
RankShards rank_shards_from_json(const nlohmann::json& j);

// Creates run_dir/checkpoints/step_XXXXXXXX.tmp-<tag> (replacing a leftover of
// the same name) and returns its path.
std::string make_staging_dir(const std::string& run_dir, int64_t step, const std::string& tag);

// Writes this rank's `write` shards to rank_RRRRR.safetensors in dir (fsync'ed,
// checksummed). Checks each tensor against its spec first.
RankShards write_rank_shards(const std::string& dir, int rank, const std::vector<NamedTensor>& local);

// Collective over world: rank 0 makes the staging dir, every rank gets its
// path; throws on every rank when rank 0 could not.
std::string stage_checkpoint(const std::string& run_dir, int64_t step, Communicator& world);
// write_rank_shards, with an error in the record instead of an exception (a
// rank that failed must still join the commit, or the others wait forever).
RankShards try_write_rank_shards(const std::string& dir, int rank, const std::vector<NamedTensor>& local);
// Collective over world, after every rank wrote (`mine`: this rank's record):
// rank 0 builds the manifest and commits (commit_checkpoint); throws on every
// rank when any rank's write or the commit failed (the staging dir removed).
void commit_rank_shards(const std::string& run_dir, const std::string& staging_dir, int64_t step,
                        const RankShards& mine, const nlohmann::json& trainer_state, Communicator& world,
                        int64_t max_to_keep, const std::vector<std::string>& keep);

// Merges every rank's record into manifest.json's content; throws naming the
// tensor when ranks disagree on its shape, dtype or split, when a shard is
// missing or written twice, or when a rank reported an error.
nlohmann::json build_manifest(int64_t step, int world_size, const std::vector<RankShards>& ranks);

// Rank 0, after every rank wrote: writes trainer_state.json and manifest.json
// into the staging dir, renames it to its final name (replacing an older save
// of the same step), points `latest` at it, then removes checkpoints beyond
// max_to_keep and stale staging dirs. Checkpoints newer than the one saved
// belong to an abandoned history (the run was resumed from further back): they
// are renamed step_XXXXXXXX.superseded so no resume picks them, never deleted.
// Names in `keep` are never removed: pruning passes them by, and a re-save of
// their step renames them step_XXXXXXXX.unreadable. Returns the final directory.
std::string commit_checkpoint(const std::string& run_dir, const std::string& staging_dir, int64_t step,
                              nlohmann::json manifest, const nlohmann::json& trainer_state, int64_t max_to_keep,
                              const std::vector<std::string>& keep = {});

}  // namespace meshtrain
