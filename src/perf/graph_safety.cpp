// The graph-safety check (see graph_safety.h): host reads through the
// operator observer, allocations through c10's memory-reporting hook (the
// allocators report to the thread's PROFILER_STATE debug info, which
// autograd's threads inherit).
#include "meshtrain/perf/graph_safety.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <mutex>
#include <sstream>

#include "meshtrain/perf/op_observer.h"

namespace meshtrain {

namespace {

// Allocations only: a free is reported only for a block allocated while
// someone listened (the CPU allocator knows no size otherwise), so the frees
// of the step before the first recorded one would be missing from it.
class AllocationLog : public c10::MemoryReportingInfoBase {
 public:
  explicit AllocationLog(at::Device device) : device_(device) {}
  void reportMemoryUsage(void* /*ptr*/, int64_t bytes, size_t, size_t, c10::Device device) override {
    if (device.type() != device_.type() || bytes <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    sizes_.push_back(bytes);
  }
  bool memoryProfilingEnabled() const override { return true; }
  std::vector<int64_t> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(sizes_);
  }

 private:
  at::Device device_;
  std::mutex mu_;
  std::vector<int64_t> sizes_;
};

}  // namespace

struct StepFootprintRecorder::State {
  explicit State(at::Device device)
      : log(std::make_shared<AllocationLog>(device)), observer(device), guard(c10::DebugInfoKind::PROFILER_STATE, log) {}
  std::shared_ptr<AllocationLog> log;
  OpObserver observer;
  c10::DebugInfoGuard guard;
};

StepFootprintRecorder::StepFootprintRecorder(at::Device device) : state_(std::make_unique<State>(device)) {}

StepFootprintRecorder::~StepFootprintRecorder() = default;

StepFootprint StepFootprintRecorder::finish() {
  StepFootprint f;
  const OpTotals& t = state_->observer.totals();
  f.host_reads = t.host_syncs;
  const std::string tag = " (host sync)";
  for (const auto& [name, row] : t.by_op)
    if (name.size() > tag.size() && name.compare(name.size() - tag.size(), tag.size(), tag) == 0)
      f.host_read_ops.push_back(name.substr(0, name.size() - tag.size()) + " x" + std::to_string(row.calls));
  f.allocations = state_->log->take();
  return f;
}

std::string graph_unsafe_reason(const StepFootprint& prev, const StepFootprint& next) {
  std::ostringstream o;
  if (next.host_reads > 0) {
    o << "the step reads device memory on the host " << next.host_reads << " time(s) (";
    for (size_t i = 0; i < next.host_read_ops.size(); ++i) o << (i ? ", " : "") << next.host_read_ops[i];
    o << "): a graph cannot wait for the device mid-step, and a decision made from the value would be replayed "
         "unchanged";
    return o.str();
  }
  const auto& a = prev.allocations;
  const auto& b = next.allocations;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) {
      o << "its memory use differs from the step before: allocation " << i + 1 << " takes " << b[i]
        << " bytes where the step before took " << a[i] << ": a graph replays one allocation pattern (shapes that "
        << "change between steps, or buffers kept from one step to the next)";
      return o.str();
    }
  if (a.size() != b.size()) {
    o << "its memory use differs from the step before: " << b.size() << " allocations against " << a.size()
      << ": a graph replays one allocation pattern";
    return o.str();
  }
  return "";
}

}  // namespace meshtrain
