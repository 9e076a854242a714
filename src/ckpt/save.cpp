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

void save_checkpoint(const std::string& run_dir, int64_t step, const std::vector<NamedTensor>& local,
                     const nlohmann::json& trainer_state, Communicator& world, int64_t max_to_keep,
                     const std::vector<std::string>& keep) {
  const int rank = world.rank();
  const std::string what = "checkpoint step " + std::to_string(step) + " in " + run_dir;

  // 1. rank 0 creates the staging dir; the pid keeps two runs sharing a
  //    run_dir by mistake from writing into each other's staging dirs.
  nlohmann::json staged = nlohmann::json::object();
  if (rank == 0) {
    try {
      staged["dir"] = make_staging_dir(run_dir, step, std::to_string(::getpid()));
    } catch (const std::exception& e) {
      staged["error"] = e.what();
    }
  }
  staged = broadcast_json(world, staged, 0);
  MT_CHECK(!staged.contains("error"), what, ": rank 0 could not create the staging dir: ",
           staged.value("error", ""));
  const std::string dir = staged.at("dir").get<std::string>();

  // 2. every rank writes its shards; failures travel with the records so all
  //    ranks leave together instead of waiting on a dead peer.
  RankShards mine;
  try {
    mine = write_rank_shards(dir, rank, local);
  } catch (const std::exception& e) {
    mine = RankShards{};
    mine.rank = rank;
    mine.error = e.what();
  }
  const auto records = all_gather_json(world, to_json(mine));
  std::vector<RankShards> ranks;
  for (const auto& r : records) ranks.push_back(rank_shards_from_json(r));

  // 3. rank 0 checks the records, writes the manifest and commits; its
  //    outcome is broadcast, which also holds every rank until the save is final.
  nlohmann::json outcome = nlohmann::json::object();
  if (rank == 0) {
    try {
      const auto manifest = build_manifest(step, world.size(), ranks);
      outcome["dir"] = commit_checkpoint(run_dir, dir, step, manifest, trainer_state, max_to_keep, keep);
    } catch (const std::exception& e) {
      outcome["error"] = e.what();
      remove_quietly(dir, "staging dir of a failed save");
    }
  }
  outcome = broadcast_json(world, outcome, 0);
  MT_CHECK(!outcome.contains("error"), what, " failed: ", outcome.value("error", ""));
}

}  // namespace meshtrain
