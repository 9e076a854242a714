#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "meshtrain/core/fs.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

// Rank 0's decisions reach the others as JSON text in byte tensors: the few
// collectives a save needs work on any Communicator and never hang a rank
// that would otherwise wait for a failed peer.
std::string dump(const nlohmann::json& j) {
  // Error messages may carry non-UTF-8 path bytes; replace them rather than throw mid-collective.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

at::Tensor to_bytes(const std::string& s) {
  at::Tensor t = at::empty({static_cast<int64_t>(s.size())}, at::kByte);
  if (!s.empty()) std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

nlohmann::json broadcast_json(Communicator& comm, const nlohmann::json& j, int root) {
  const std::string text = comm.rank() == root ? dump(j) : std::string();
  at::Tensor len = at::tensor({static_cast<int64_t>(text.size())}, at::kLong);
  comm.broadcast(len, root);
  at::Tensor bytes = comm.rank() == root ? to_bytes(text) : at::empty({len.item<int64_t>()}, at::kByte);
  comm.broadcast(bytes, root);
  return nlohmann::json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
}

// Every rank gets every rank's record; records differ in length, so pad to the longest.
std::vector<nlohmann::json> all_gather_json(Communicator& comm, const nlohmann::json& j) {
  const std::string text = dump(j);
  const at::Tensor lens = comm.all_gather(at::tensor({static_cast<int64_t>(text.size())}, at::kLong));
  const int64_t longest = lens.max().item<int64_t>();
  at::Tensor padded = at::zeros({longest}, at::kByte);
  if (!text.empty()) std::memcpy(padded.data_ptr(), text.data(), text.size());
  const at::Tensor all = comm.all_gather(padded).contiguous();
  std::vector<nlohmann::json> out;
  for (int r = 0; r < comm.size(); ++r) {
    const auto* p = static_cast<const char*>(all.data_ptr()) + r * longest;
    out.push_back(nlohmann::json::parse(std::string(p, lens[r].item<int64_t>())));
  }
  return out;
}

}  // namespace

void save_checkpoint(const std::string& run_dir, int64_t step, const std::vector<NamedTensor>& local,
                     const nlohmann::json& trainer_state, Communicator& world, int64_t max_to_keep) {
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
      outcome["dir"] = commit_checkpoint(run_dir, dir, step, manifest, trainer_state, max_to_keep);
    } catch (const std::exception& e) {
      outcome["error"] = e.what();
      remove_quietly(dir, "staging dir of a failed save");
    }
  }
  outcome = broadcast_json(world, outcome, 0);
  MT_CHECK(!outcome.contains("error"), what, " failed: ", outcome.value("error", ""));
}

}  // namespace meshtrain
