// Step profiles (see profile.h): torch's Kineto profiler, summed by category.
#include "meshtrain/perf/profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cctype>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool has_any(const std::string& s, std::initializer_list<const char*> parts) {
  return std::any_of(parts.begin(), parts.end(), [&](const char* p) { return s.find(p) != std::string::npos; });
}

std::set<ActivityType> activities(bool cuda) {
  if (cuda) return {ActivityType::CPU, ActivityType::CUDA};
  return {ActivityType::CPU};
}

// One event's time without the events nested inside it on the same thread
// (CPU operators nest: aten::linear calls aten::addmm). Kernels do not nest,
// so for them this is their duration.
struct Interval {
  uint64_t start, end;
  size_t index;
};

std::vector<double> self_seconds(const std::vector<prof::KinetoEvent>& events, const std::vector<size_t>& picked) {
  std::map<uint64_t, std::vector<Interval>> by_lane;
  for (size_t i : picked) {
    const auto& e = events[i];
    // A lane: a CPU thread, or a device stream.
    const uint64_t lane = e.deviceType() == c10::DeviceType::CPU ? e.startThreadId()
                                                                   : static_cast<uint64_t>(e.deviceResourceId());
    by_lane[lane].push_back({e.startNs(), e.startNs() + e.durationNs(), i});
  }
  std::vector<double> self(events.size(), 0.0);
  for (auto& [lane, iv] : by_lane) {
    std::sort(iv.begin(), iv.end(), [](const Interval& a, const Interval& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;  // parents before their children
    });
    std::vector<const Interval*> open;
    for (const Interval& x : iv) {
      while (!open.empty() && open.back()->end <= x.start) open.pop_back();
      const double d = static_cast<double>(x.end - x.start) * 1e-9;
      self[x.index] += d;
      if (!open.empty()) self[open.back()->index] -= d;  // the parent's time that was this child's
      open.push_back(&x);
    }
  }
  return self;
}

}  // namespace

std::string kernel_category(const std::string& name) {
  const std::string n = lower(name);
  if (has_any(n, {"nccl", "all_reduce", "allreduce", "all_gather", "reduce_scatter", "all_to_all", "c10d"}))
    return "comm";
  if (has_any(n, {"flash", "fmha", "attention", "sdpa", "cudnn"})) return "attention";
  if (has_any(n, {"gemm", "cutlass", "nvjet", "xmma", "cublas", "wgmma"})) return "gemm";
  for (const char* op : {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"})
    if (n == op) return "gemm";
  if (has_any(n, {"memcpy", "memset", "aten::copy_", "aten::to_copy", "aten::_to_copy"})) return "copy";
  return "other";
}

double ProfileSummary::gap_seconds() const { return std::max(0.0, step_seconds() - busy_seconds); }

StepProfiler::StepProfiler(bool cuda) : cuda_(cuda) {
  const ProfilerConfig config(ProfilerState::KINETO);
  prof::prepareProfiler(config, activities(cuda_));
  prof::enableProfiler(config, activities(cuda_));
  running_ = true;
}

StepProfiler::~StepProfiler() {
  if (running_) prof::disableProfiler();  // stop() was not reached (an error in a step)
}

ProfileSummary StepProfiler::stop(int64_t steps, double wall_seconds, const std::string& trace_path, size_t top_n) {
  MT_CHECK(running_, "StepProfiler::stop called twice");
  MT_CHECK(steps >= 1, "a profile needs at least one step, got ", steps);
  running_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  ProfileSummary p;
  p.steps = steps;
  p.wall_seconds = wall_seconds;
  p.device_kernels = cuda_;
  const auto& events = result->events();
  std::vector<size_t> picked;
  const c10::DeviceType want = cuda_ ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].deviceType() == want && events[i].durationNs() > 0) picked.push_back(i);
  const std::vector<double> self = self_seconds(events, picked);

  std::unordered_map<std::string, KernelTotal> by_name;
  for (size_t i : picked) {
    KernelTotal& k = by_name[events[i].name()];
    if (k.name.empty()) k.name = events[i].name(), k.category = kernel_category(k.name);
    k.seconds += self[i];
    k.calls += 1;
  }
  const double per_step = 1.0 / static_cast<double>(steps);
  for (auto& [name, k] : by_name) {
    p.seconds_by_category[k.category] += k.seconds * per_step;
    p.calls_by_category[k.category] += k.calls;
    p.busy_seconds += k.seconds * per_step;
    p.top.push_back(k);
  }
  for (auto& [cat, n] : p.calls_by_category) n /= steps;
  std::sort(p.top.begin(), p.top.end(), [](const KernelTotal& a, const KernelTotal& b) { return a.seconds > b.seconds; });
  if (p.top.size() > top_n) p.top.resize(top_n);
  if (!trace_path.empty()) {
    result->save(trace_path);
    p.trace_path = trace_path;
  }
  return p;
}

std::string to_string(const ProfileSummary& p) {
  std::ostringstream o;
  const double step = p.step_seconds();
  auto pct = [&](double s) { return step > 0 ? 100.0 * s / step : 0.0; };
  o << std::fixed << std::setprecision(2);
  o << "profile: " << p.steps << " step(s), " << step * 1e3 << " ms per step; "
    << (p.device_kernels ? "device kernels" : "CPU operators (self time)") << " per step:\n";
  for (const auto& [cat, s] : p.seconds_by_category)
    o << "  " << std::left << std::setw(10) << cat << std::right << std::setw(10) << s * 1e3 << " ms "
      << std::setw(6) << pct(s) << "%  " << p.calls_by_category.at(cat) << " calls\n";
  o << "  " << std::left << std::setw(10) << "gaps" << std::right << std::setw(10) << p.gap_seconds() * 1e3
    << " ms " << std::setw(6) << pct(p.gap_seconds()) << "%  (the step's wall time no kernel covers)\n";
  o << "  largest, over all profiled steps:\n";
  for (const KernelTotal& k : p.top) {
    std::string name = k.name.size() > 90 ? k.name.substr(0, 87) + "..." : k.name;
    o << "    " << std::setw(9) << k.seconds * 1e3 << " ms " << std::setw(7) << k.calls << "x  " << std::left
      << std::setw(9) << k.category << std::right << " " << name << "\n";
  }
  if (!p.trace_path.empty()) o << "  trace: " << p.trace_path << "\n";
  return o.str();
}

nlohmann::json to_json(const ProfileSummary& p) {
  nlohmann::json j;
  j["steps"] = p.steps;
  j["step_ms"] = p.step_seconds() * 1e3;
  j["source"] = p.device_kernels ? "cuda_kernels" : "cpu_operators_self";
  for (const auto& [cat, s] : p.seconds_by_category) {
    j["ms_per_step"][cat] = s * 1e3;
    j["calls_per_step"][cat] = p.calls_by_category.at(cat);
  }
  j["busy_ms_per_step"] = p.busy_seconds * 1e3;
  j["gap_ms_per_step"] = p.gap_seconds() * 1e3;
  j["top"] = nlohmann::json::array();
  for (const KernelTotal& k : p.top)
    j["top"].push_back({{"name", k.name}, {"category", k.category}, {"ms", k.seconds * 1e3}, {"calls", k.calls}});
  if (!p.trace_path.empty()) j["trace"] = p.trace_path;
  return j;
}

}  // namespace meshtrain
