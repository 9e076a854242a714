#pragma once
// A profile of a few training steps (`meshtrain bench --profile DIR`): where a
// step's time goes, by kernel. On a GPU it reads the CUDA kernels, copies and
// collectives that ran (torch's Kineto/CUPTI profiler) and reports the device
// time per category (GEMM, attention, communication, copies, everything else,
// which is memory-bound) beside the step's wall time: what the kernels do not
// cover is the gaps between them (launches, host syncs, waits). On CPU it
// reports each operator's self time (its time minus its children's), so a
// nested call is counted once. Each rank writes its Chrome trace
// (chrome://tracing, Perfetto) into DIR.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace meshtrain {

// The category of a kernel or operator, from its name: "gemm", "attention",
// "comm", "copy" or "other".
std::string kernel_category(const std::string& name);

struct KernelTotal {
  std::string name;
  std::string category;
  double seconds = 0;  // over all profiled steps
  int64_t calls = 0;
};

struct ProfileSummary {
  int64_t steps = 0;
  double wall_seconds = 0;                      // the profiled steps, on this rank
  bool device_kernels = false;                  // true: CUDA kernels; false: CPU operators' self time
  std::map<std::string, double> seconds_by_category;  // per step
  std::map<std::string, int64_t> calls_by_category;   // per step
  double busy_seconds = 0;                      // per step: the sum over categories
  std::vector<KernelTotal> top;                 // the largest, by time
  std::string trace_path;                       // this rank's Chrome trace; empty: not written
  double step_seconds() const { return steps > 0 ? wall_seconds / static_cast<double>(steps) : 0; }
  // The part of a step no kernel covers (0 when kernels on several streams overlap more than that).
  double gap_seconds() const;
};

// Records from construction until stop(); one at a time per process.
class StepProfiler {
 public:
  explicit StepProfiler(bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;
  // Ends the recording, writes the trace to trace_path (when not empty) and
  // sums the events over `steps` steps that took wall_seconds.
  ProfileSummary stop(int64_t steps, double wall_seconds, const std::string& trace_path, size_t top_n);

 private:
  bool cuda_;
  bool running_ = false;
};

std::string to_string(const ProfileSummary& p);
nlohmann::json to_json(const ProfileSummary& p);

}  // namespace meshtrain
