#include <torch/torch.h>

#include <sstream>

#include "meshtrain/core/text.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/config/choices.h"

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

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// "parameters: N total, M active per token" from the model tensors' global
// shapes and the saved model_config, counted as count_params() does
// (model/transformer.h; ckpt works on names, not model types): k of n_experts
// routed experts are active, and active_params_scope "layers" leaves out
// everything outside "layers." (embedding, head, final norm).
std::string parameter_line(const CheckpointReader& r) {
  int64_t total = 0, routed = 0, outside_layers = 0;
  for (const auto& name : r.names()) {
    if (name.rfind("model.", 0) != 0) continue;
    const int64_t n = numel(r.global_shape(name));
    total += n;
    if (name.find(".moe.experts.") != std::string::npos) routed += n;
    if (name.rfind("model.layers.", 0) != 0) outside_layers += n;
  }
  std::string line = "  parameters: " + std::to_string(total) + " total";
  const auto& state = r.trainer_state();
  if (!state.is_object() || !state.contains("config") || !state["config"].contains("model_config")) return line + "\n";
  const auto& m = state["config"]["model_config"];
  const int64_t E = m.value("n_experts", int64_t{0}), k = m.value("k", int64_t{0});
  int64_t active = total;
  if (routed > 0 && E > 0) active -= routed / E * (E - k);
  // The stored config's spelling, read with the config's own table.
  const std::string scope = m.value("active_params_scope", std::string("model"));
  if (parse_choice<ActiveParamsScope>(scope) == ActiveParamsScope::Layers) active -= outside_layers;
  return line + ", " + std::to_string(active) + " active per token\n";
}

// "saved on mesh dp 2 x pp 1 x tp 1 x cp 2": where the training ran (any
// mesh loads it; context parallelism splits each sequence, not the tensors).
std::string mesh_line(const CheckpointReader& r) {
  const auto& state = r.trainer_state();
  if (!state.is_object() || !state.contains("mesh") || !state["mesh"].is_array() || state["mesh"].size() != 3) return "";
  const auto& m = state["mesh"];
  std::string line = "  saved on mesh dp " + m[0].dump() + " x pp " + m[1].dump() + " x tp " + m[2].dump();
  const int64_t cp = state.value("context_parallel", int64_t{1});
  if (cp > 1) line += " x cp " + std::to_string(cp) + " (each sequence split over " + std::to_string(cp) + " ranks)";
  return line + "\n";
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
     << parameter_line(r) << mesh_line(r) << "tensors:\n";
  for (const auto& name : r.names()) {
    const auto& t = m.at("tensors").at(name);
    const auto split = t.at("split_dim").get<int64_t>();
    const auto outer = t.value("outer_dim", int64_t{-1});
    std::string layout = outer < 0 && split < 0 ? "replicated" : "";
    // Experts under expert parallelism: "experts (dim 0) in 2, split dim 1 in 2".
    if (outer >= 0)
      layout = (outer == 0 && name.find(".moe.experts.") != std::string::npos ? "experts (dim 0)" : "split dim " + std::to_string(outer)) +
               " in " + std::to_string(t.at("outer_shards").get<int64_t>()) + (split >= 0 ? ", " : "");
    if (split >= 0) layout += "split dim " + std::to_string(split) + " in " + std::to_string(t.at("num_shards").get<int64_t>());
    os << "  " << name << "  " << shape_str(r.global_shape(name)) << "  " << t.at("dtype").get<std::string>() << "  "
       << layout << "\n";
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
