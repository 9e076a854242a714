#include <map>

#include "manifest_format.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

nlohmann::json build_manifest(int64_t step, int world_size, const std::vector<RankShards>& ranks) {
  for (const auto& r : ranks)
    MT_CHECK(r.error.empty(), "checkpoint step ", step, ": rank ", r.rank, " failed to write its shards: ", r.error);

  struct Located {
    int rank;
    std::string file, key;
  };
  struct Tensor {
    RankShards::Shard first;  // the layout every other shard must agree with
    int first_rank;
    std::map<int64_t, Located> shards;
  };
  std::map<std::string, Tensor> tensors;
  nlohmann::json files = nlohmann::json::object();
  for (const auto& r : ranks) {
    if (!r.file.empty()) files[r.file] = {{"bytes", r.bytes}, {"checksum", r.checksum}};
    for (const auto& s : r.shards) {
      auto [it, fresh] = tensors.try_emplace(s.name, Tensor{s, r.rank, {}});
      const auto& f = it->second.first;
      MT_CHECK(f.spec.global_shape == s.spec.global_shape && f.spec.split_dim == s.spec.split_dim &&
                   f.spec.num_shards == s.spec.num_shards && f.spec.outer_dim == s.spec.outer_dim &&
                   f.spec.outer_shards == s.spec.outer_shards && f.dtype == s.dtype,
               "tensor \"", s.name, "\": ranks ", it->second.first_rank, " and ", r.rank,
               " disagree on its global shape, split or dtype");
      auto [at, added] = it->second.shards.try_emplace(s.spec.index(), Located{r.rank, r.file, s.key});
      MT_CHECK(added, "tensor \"", s.name, "\": shard ", s.spec.index(), " is written by both rank ", at->second.rank,
               " and rank ", r.rank, " (set write=true on one owner only)");
    }
  }

  nlohmann::json out_tensors = nlohmann::json::object();
  for (const auto& [name, t] : tensors) {
    nlohmann::json shards = nlohmann::json::array();
    for (int64_t i = 0; i < t.first.spec.total_shards(); ++i) {
      auto it = t.shards.find(i);
      MT_CHECK(it != t.shards.end(), "tensor \"", name, "\": no rank wrote shard ", i, " of ",
               t.first.spec.total_shards(), " (is write=false on every owner?)");
      shards.push_back({{"index", i}, {"file", it->second.file}, {"key", it->second.key}});
    }
    out_tensors[name] = {{"global_shape", t.first.spec.global_shape},
                         {"dtype", t.first.dtype},
                         {"split_dim", t.first.spec.split_dim},
                         {"num_shards", t.first.spec.num_shards},
                         {"shards", shards}};
    if (t.first.spec.outer_dim >= 0) {
      out_tensors[name]["outer_dim"] = t.first.spec.outer_dim;
      out_tensors[name]["outer_shards"] = t.first.spec.outer_shards;
    }
  }
  return {{"format", ckpt_format::kFormat}, {"version", ckpt_format::kVersion}, {"step", step},
          {"world_size", world_size},       {"tensors", out_tensors},           {"files", files}};
}

}  // namespace meshtrain
