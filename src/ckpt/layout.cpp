#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "manifest_format.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"

namespace meshtrain {

namespace fs = std::filesystem;

std::string checkpoints_root(const std::string& run_dir) { return (fs::path(run_dir) / "checkpoints").string(); }

std::string checkpoint_dir_name(int64_t step) {
  MT_CHECK(step >= 0, "checkpoint step must be >= 0, got ", step);
  char s[32];
  std::snprintf(s, sizeof s, "step_%08lld", static_cast<long long>(step));
  return s;
}

void require_checkpoint_root(const std::string& run_dir) {
  const std::string root = checkpoints_root(run_dir);
  require_writable_folder(root, "checkpoint folder");
  for (const std::string name : {std::string(ckpt_format::kLatest), std::string(ckpt_format::kLatest) + ".tmp"}) {
    const std::string p = (fs::path(root) / name).string(), kind = non_regular_kind(p);
    MT_CHECK(kind.empty() || kind == "missing", "the checkpoint pointer ", p, " is ", kind,
             ", not a file: every save rewrites it (it names the newest checkpoint); move it away or choose another ",
             "output_dir / name");
  }
}

std::optional<int64_t> parse_checkpoint_dir_name(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() < prefix.size() + 8 || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string make_staging_dir(const std::string& run_dir, int64_t step, const std::string& tag) {
  const fs::path dir = fs::path(checkpoints_root(run_dir)) /
                       (checkpoint_dir_name(step) + ckpt_format::kStagingMarker + "-" + tag);
  std::error_code ec;
  fs::remove_all(dir, ec);  // a leftover of a crashed save of the same step
  MT_CHECK(!ec, "cannot remove the leftover staging dir ", dir.string(), ": ", ec.message());
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, "cannot create the checkpoint staging dir ", dir.string(), ": ", ec.message());
  return dir.string();
}

nlohmann::json to_json(const RankShards& r) {
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& s : r.shards) {
    nlohmann::json j = {{"name", s.name},
                        {"key", s.key},
                        {"dtype", s.dtype},
                        {"global_shape", s.spec.global_shape},
                        {"split_dim", s.spec.split_dim},
                        {"shard", s.spec.shard},
                        {"num_shards", s.spec.num_shards}};
    if (s.spec.outer_dim >= 0) {
      j["outer_dim"] = s.spec.outer_dim;
      j["outer_shard"] = s.spec.outer_shard;
      j["outer_shards"] = s.spec.outer_shards;
    }
    shards.push_back(std::move(j));
  }
  return {{"rank", r.rank},         {"file", r.file},     {"bytes", r.bytes},
          {"checksum", r.checksum}, {"shards", shards},   {"error", r.error}};
}

RankShards rank_shards_from_json(const nlohmann::json& j) {
  RankShards r;
  r.rank = j.at("rank").get<int>();
  r.file = j.at("file").get<std::string>();
  r.bytes = j.at("bytes").get<int64_t>();
  r.checksum = j.at("checksum").get<std::string>();
  r.error = j.at("error").get<std::string>();
  for (const auto& s : j.at("shards")) {
    RankShards::Shard sh;
    sh.name = s.at("name").get<std::string>();
    sh.key = s.at("key").get<std::string>();
    sh.dtype = s.at("dtype").get<std::string>();
    sh.spec.global_shape = s.at("global_shape").get<std::vector<int64_t>>();
    sh.spec.split_dim = s.at("split_dim").get<int64_t>();
    sh.spec.shard = s.at("shard").get<int64_t>();
    sh.spec.num_shards = s.at("num_shards").get<int64_t>();
    sh.spec.outer_dim = s.value("outer_dim", int64_t{-1});
    sh.spec.outer_shard = s.value("outer_shard", int64_t{0});
    sh.spec.outer_shards = s.value("outer_shards", int64_t{1});
    r.shards.push_back(std::move(sh));
  }
  return r;
}

}  // namespace meshtrain
