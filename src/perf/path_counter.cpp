// The path counter (see path_counter.h): a user-scope RecordFunction callback
// that parses the events of ops::note_path.
#ifndef NDEBUG
#error "path_counter.cpp must be compiled with NDEBUG, as libtorch is (see CMakeLists.txt)"
#endif
#include "meshtrain/perf/path_counter.h"

#include <ATen/record_function.h>

#include <cstring>
#include <mutex>
#include <sstream>
#include <utility>

#include "meshtrain/core/check.h"
#include "meshtrain/ops/paths.h"

namespace meshtrain {

struct PathCounter::State {
  mutable std::mutex mu;
  std::map<std::string, OpPaths> counts;
  at::CallbackHandle handle = 0;
};

namespace {

// The counter the callback adds to: RecordFunction takes a plain function
// pointer, so it is found through this one pointer (ARCHITECTURE.md lists
// it with the other globals forced by a C or callback API).
struct Active {
  std::mutex mu;
  PathCounter::State* state = nullptr;
};
Active& active() {
  static Active a;
  return a;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  const size_t prefix = std::strlen(ops::kPathPrefix);
  if (!name || std::strncmp(name, ops::kPathPrefix, prefix) != 0) return nullptr;
  // "<op>|fast|<what>" or "<op>|fallback|<what>"; what may hold '|'.
  const std::string rest(name + prefix);
  const size_t a = rest.find('|'), b = a == std::string::npos ? a : rest.find('|', a + 1);
  if (b == std::string::npos) return nullptr;
  const std::string op = rest.substr(0, a), kind = rest.substr(a + 1, b - a - 1), what = rest.substr(b + 1);
  std::lock_guard<std::mutex> lock(active().mu);
  PathCounter::State* s = active().state;
  if (!s) return nullptr;
  std::lock_guard<std::mutex> state_lock(s->mu);
  OpPaths& p = s->counts[op];
  if (kind == "fast") {
    ++p.fast;
    ++p.fast_paths[what];
  } else {
    ++p.fallback;
    ++p.fallback_reasons[what];
  }
  return nullptr;
}

}  // namespace

PathCounter::PathCounter() : state_(std::make_unique<State>()) {
  {
    std::lock_guard<std::mutex> lock(active().mu);
    MT_ASSERT(active().state == nullptr, "one PathCounter at a time");
    active().state = state_.get();
  }
  state_->handle =
      at::addGlobalCallback(at::RecordFunctionCallback(&on_start).scopes({at::RecordScope::USER_SCOPE}));
}

PathCounter::~PathCounter() {
  at::removeCallback(state_->handle);
  std::lock_guard<std::mutex> lock(active().mu);
  active().state = nullptr;
}

std::map<std::string, OpPaths> PathCounter::counts() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->counts;
}

nlohmann::json paths_json(const std::map<std::string, OpPaths>& counts) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [op, p] : counts)
    j[op] = {{"fast", p.fast},
             {"fallback", p.fallback},
             {"fast_paths", p.fast_paths},
             {"fallback_reasons", p.fallback_reasons}};
  return j;
}

std::string paths_text(const std::map<std::string, OpPaths>& counts) {
  std::ostringstream o;
  for (const auto& [op, p] : counts) {
    o << "    " << op << ": " << p.fast << " fast";
    const char* sep = " (";
    for (const auto& [path, n] : p.fast_paths) o << std::exchange(sep, ", ") << path << " " << n;
    if (!p.fast_paths.empty()) o << ")";
    o << ", " << p.fallback << " fallback";
    for (const auto& [why, n] : p.fallback_reasons) o << "; " << n << " because " << why;
    o << "\n";
  }
  return o.str();
}

}  // namespace meshtrain
