#pragma once
// Counts the paths the fused operators take (ops/paths.h) while it lives,
// on every thread (autograd's backward threads too): per operator, the calls
// that took a fast path and those that fell back, by path and by reason.
// `meshtrain bench` counts its timed steps with one (JSON "paths").
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace meshtrain {

struct OpPaths {
  int64_t fast = 0, fallback = 0;
  std::map<std::string, int64_t> fast_paths;        // by path ("16-byte vectors", "cuBLASLt GELU_AUX epilogue")
  std::map<std::string, int64_t> fallback_reasons;  // by reason
};

class PathCounter {
 public:
  // One at a time in a process (the callback finds it through one pointer).
  PathCounter();
  ~PathCounter();
  PathCounter(const PathCounter&) = delete;
  PathCounter& operator=(const PathCounter&) = delete;

  // By operator name ("rms_norm_bwd", "linear_gelu", "attention", ...).
  std::map<std::string, OpPaths> counts() const;

  struct State;  // the callback's view (path_counter.cpp)

 private:
  std::unique_ptr<State> state_;
};

// {"op": {"fast": n, "fallback": m, "fast_paths": {...}, "fallback_reasons": {...}}, ...}
nlohmann::json paths_json(const std::map<std::string, OpPaths>& counts);
// One line per operator, fallbacks with their reasons; empty when none counted.
std::string paths_text(const std::map<std::string, OpPaths>& counts);

}  // namespace meshtrain
