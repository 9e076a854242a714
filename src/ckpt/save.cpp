#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "json_collectives.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/fs.h"

namespace meshtrain {

using ckpt_comm::all_gather_json;
using ckpt_comm::broadcast_json;

namespace {

std::string what_saved(const std::string& run_dir, int64_t step) {
  return "checkpoint step " + std::to_string(step) + " in " + run_dir;
}

}  // namespace

std::string stage_checkpoint(const std::string& run_dir, int64_t step, Communicator& world) {
  // rank 0 creates the staging dir; the pid keeps two runs sharing a run_dir
  // by mistake from writing into each other's staging dirs.
  nlohmann::json staged = nlohmann::json::object();
  if (world.rank() == 0) {
    try {
      staged["dir"] = make_staging_dir(run_dir, step, std::to_string(::getpid()));
    } catch (const std::exception& e) {
      staged["error"] = e.what();
    }
  }
  staged = broadcast_json(world, staged, 0);
  MT_CHECK(!staged.contains("error"), what_saved(run_dir, step), ": rank 0 could not create the staging dir: ",
           staged.value("error", ""));
  return staged.at("dir").get<std::string>();
}

RankShards try_write_rank_shards(const std::string& dir, int rank, const std::vector<NamedTensor>& local) {
  try {
    return write_rank_shards(dir, rank, local);
  } catch (const std::exception& e) {
    RankShards failed;
    failed.rank = rank;
    failed.error = e.what();
    return failed;
  }
}

void commit_rank_shards(const std::string& run_dir, const std::string& staging_dir, int64_t step,
                        const RankShards& mine, const nlohmann::json& trainer_state, Communicator& world,
                        int64_t max_to_keep, const std::vector<std::string>& keep) {
  // Failures travel with the records so all ranks leave together instead of
  // waiting on a dead peer.
  const auto records = all_gather_json(world, to_json(mine));
  std::vector<RankShards> ranks;
  for (const auto& r : records) ranks.push_back(rank_shards_from_json(r));
  // rank 0 checks the records, writes the manifest and commits; its outcome
  // is broadcast, which also holds every rank until the save is final.
  nlohmann::json outcome = nlohmann::json::object();
  if (world.rank() == 0) {
    try {
      const auto manifest = build_manifest(step, world.size(), ranks);
      outcome["dir"] = commit_checkpoint(run_dir, staging_dir, step, manifest, trainer_state, max_to_keep, keep);
    } catch (const std::exception& e) {
      outcome["error"] = e.what();
      remove_quietly(staging_dir, "staging dir of a failed save");
    }
  }
  outcome = broadcast_json(world, outcome, 0);
  MT_CHECK(!outcome.contains("error"), what_saved(run_dir, step), " failed: ", outcome.value("error", ""));
}

void save_checkpoint(const std::string& run_dir, int64_t step, const std::vector<NamedTensor>& local,
                     const nlohmann::json& trainer_state, Communicator& world, int64_t max_to_keep,
                     const std::vector<std::string>& keep) {
  const std::string dir = stage_checkpoint(run_dir, step, world);
  const RankShards mine = try_write_rank_shards(dir, world.rank(), local);
  commit_rank_shards(run_dir, dir, step, mine, trainer_state, world, max_to_keep, keep);
}

}  // namespace meshtrain
