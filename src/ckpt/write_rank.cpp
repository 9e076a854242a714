#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "meshtrain/core/text.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

std::string rank_file_name(int rank) {
  char s[40];
  std::snprintf(s, sizeof s, "rank_%05d.safetensors", rank);
  return s;
}

}  // namespace

RankShards write_rank_shards(const std::string& dir, int rank, const std::vector<NamedTensor>& local) {
  RankShards out;
  out.rank = rank;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::set<std::string> keys;
  for (const auto& t : local) {
    if (!t.write) continue;
    MT_CHECK(!t.name.empty() && t.name.find('@') == std::string::npos, "tensor name \"", t.name,
             "\" (rank ", rank, ") must be non-empty and must not contain '@'");
    MT_CHECK(t.tensor.defined(), "tensor \"", t.name, "\" on rank ", rank, " is undefined");
    const auto want = shard_shape(t.spec, t.name);
    MT_CHECK(t.tensor.sizes().vec() == want, "tensor \"", t.name, "\" on rank ", rank, " has shape ",
             shape_str(t.tensor.sizes().vec()), " but shard ", t.spec.index(), " of ", t.spec.total_shards(),
             " of its global shape ", shape_str(t.spec.global_shape), " is ", shape_str(want));
    RankShards::Shard s;
    s.name = t.name;
    s.key = t.name + "@" + std::to_string(t.spec.index());
    s.dtype = safetensors_dtype_name(t.tensor.scalar_type());
    s.spec = t.spec;
    MT_CHECK(keys.insert(s.key).second, "rank ", rank, " was given shard ", t.spec.index(), " of \"", t.name,
             "\" twice");
    tensors.emplace_back(s.key, t.tensor.detach());
    out.shards.push_back(std::move(s));
  }
  if (tensors.empty()) return out;  // a pure replica rank writes no file
  out.file = rank_file_name(rank);
  const auto digest = write_safetensors((std::filesystem::path(dir) / out.file).string(), tensors,
                                        {{"format", "pt"}, {"meshtrain_rank", std::to_string(rank)}});
  out.bytes = digest.bytes;
  out.checksum = crc32c_string(digest.crc32c);
  return out;
}

}  // namespace meshtrain
