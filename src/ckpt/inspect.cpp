#include <torch/torch.h>

#include <sstream>

#include "meshtrain/core/text.h"
#include "meshtrain/ckpt/checkpoint.h"

namespace meshtrain {

namespace {

// One line per top-level key: scalars as they are, containers by size, so a
// whole config or RNG state doesn't flood the listing.
std::string summary(const nlohmann::json& v) {
  if (v.is_object()) return "{" + std::to_string(v.size()) + " keys}";
  if (v.is_array()) return "[" + std::to_string(v.size()) + " items]";
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

}  // namespace

std::string inspect_checkpoint(const std::string& ckpt_dir) {
  const CheckpointReader r(ckpt_dir);
  r.verify();  // inspecting is how people judge a checkpoint: a corrupt one must say so
  const auto& m = r.manifest();
  int64_t bytes = 0;
  for (const auto& [file, info] : m.at("files").items()) bytes += info.at("bytes").get<int64_t>();

  std::ostringstream os;
  os << "checkpoint " << ckpt_dir << "\n"
     << "  step " << r.step() << ", saved by " << r.world_size() << " ranks, " << r.names().size() << " tensors, "
     << m.at("files").size() << " files, " << bytes << " bytes\n"
     << "tensors:\n";
  for (const auto& name : r.names()) {
    const auto& t = m.at("tensors").at(name);
    const auto split = t.at("split_dim").get<int64_t>();
    os << "  " << name << "  " << shape_str(r.global_shape(name)) << "  " << t.at("dtype").get<std::string>() << "  "
       << (split < 0 ? std::string("replicated")
                     : "split dim " + std::to_string(split) + " in " + std::to_string(t.at("num_shards").get<int64_t>()))
       << "\n";
  }
  os << "trainer state:\n";
  const auto& state = r.trainer_state();
  if (state.is_object())
    for (const auto& [k, v] : state.items()) os << "  " << k << ": " << summary(v) << "\n";
  else
    os << "  " << summary(state) << "\n";
  return os.str();
}

}  // namespace meshtrain
