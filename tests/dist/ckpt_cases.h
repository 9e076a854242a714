#pragma once
// The meshes the checkpoint-writing tests save on (ckpt_save_test,
// async_ckpt_test): each has something a save must skip or gather -- dp
// shards, tp replicas that tp rank 1 never writes, pipeline stages, experts
// written by the first expert-dp replica only -- and the tiny run config of
// one case.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "parity.h"

namespace meshtrain::test {

struct SaveCase {
  std::string model;  // "dense" | "moe"
  int dp, pp, tp, ep;
  std::string str() const {
    return model + " " + std::to_string(dp) + "x" + std::to_string(pp) + "x" + std::to_string(tp) +
           (ep > 1 ? " ep" + std::to_string(ep) : "");
  }
  std::string tag() const {
    return model + std::to_string(dp) + std::to_string(pp) + std::to_string(tp) + std::to_string(ep);
  }
};

inline std::vector<SaveCase> save_cases(int n) {
  if (n == 2) return {{"dense", 2, 1, 1, 1}, {"moe", 2, 1, 1, 2}};
  if (n == 4) return {{"dense", 2, 1, 2, 1}, {"dense", 2, 2, 1, 1}, {"moe", 4, 1, 1, 2}};
  return {};
}

// The case's config at zero_stage `stage`, its run dir `run` (emptied).
inline Config save_case_config(const SaveCase& k, int stage, const std::string& data_dir, const std::string& run) {
  Config c = tiny_config(synthetic_data(data_dir, 96),
                         run + "-" + k.tag() + "-z" + std::to_string(stage) + "-np" +
                             std::to_string(test_runtime().size()));
  if (k.model == "moe") {
    c = moe_mla(c);
    c.model.capacity_factor = 0;  // dropless: expert loads differ per rank
  }
  c = with_mesh(c, k.dp, k.pp, k.tp);
  c.device.expert_parallel = k.ep;
  if (k.pp > 1) c.data.micro_batch_size = c.data.train_batch_size / k.dp / 4;
  c.zero_stage = stage;
  // A previous run of the test left checkpoints here.
  if (test_runtime().rank() == 0) std::filesystem::remove_all(c.run_dir());
  test_runtime().world()->barrier();
  return c;
}

inline std::string file_contents(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace meshtrain::test
