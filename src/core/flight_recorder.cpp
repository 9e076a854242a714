#include "meshtrain/core/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "meshtrain/core/check.h"
#include "meshtrain/core/host.h"

namespace meshtrain {

namespace {

constexpr size_t kPhases = 256;  // phase names kept: a few per step, so as far back as the ring goes

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string flight_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.json", rank);
  return name;
}

FlightRecorder::FlightRecorder(int64_t capacity, int rank)
    : capacity_(std::max<int64_t>(0, capacity)), rank_(rank), ring_(static_cast<size_t>(capacity_)) {
  phases_.reserve(kPhases);
}

int FlightRecorder::add_axis(const std::string& name, int group, int rank, int size) {
  std::lock_guard<std::mutex> lock(mu_);
  axes_.push_back({name, group, rank, size, 0, 0});
  return static_cast<int>(axes_.size()) - 1;
}

int64_t FlightRecorder::begin(int axis, const char* op, const char* dtype, int peer, int64_t bytes) {
  if (capacity_ == 0) return -1;
  const int64_t start = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  FlightAxis& a = axes_[static_cast<size_t>(axis)];
  const int64_t token = next_++;
  FlightEntry& e = ring_[static_cast<size_t>(token % capacity_)];
  e.seq = ++a.started;
  e.op = op;
  e.dtype = dtype;
  e.axis = axis;
  e.peer = peer;
  e.bytes = bytes;
  e.start_ns = start;
  e.end_ns = 0;
  e.step = step_.load(std::memory_order_relaxed);
  e.phase = phase_serial_;
  changes_.fetch_add(1, std::memory_order_relaxed);
  return token;
}

void FlightRecorder::end(int64_t token) {
  const int64_t stop = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry& e = ring_[static_cast<size_t>(token % capacity_)];
  // The ring wrapped past an op still open (more than capacity ops inside
  // it, impossible for blocking ops): its slot belongs to a newer record.
  if (token + capacity_ < next_) return;
  e.end_ns = stop;
  op_ns_[e.step] += stop - e.start_ns;
  ++axes_[static_cast<size_t>(e.axis)].ended;
  changes_.fetch_add(1, std::memory_order_relaxed);
}

void FlightRecorder::set_phase(const std::string& phase) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ++phase_serial_;
  const size_t slot = static_cast<size_t>(phase_serial_ % static_cast<int64_t>(kPhases));
  if (phases_.size() <= slot) phases_.resize(slot + 1);
  phases_[slot] = phase;
}

double FlightRecorder::take_op_seconds() {
  return take_op_seconds_through(std::numeric_limits<int64_t>::max());
}

double FlightRecorder::take_op_seconds_through(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t ns = 0;
  const auto end = op_ns_.upper_bound(step);
  for (auto it = op_ns_.begin(); it != end; ++it) ns += it->second;
  op_ns_.erase(op_ns_.begin(), end);
  return static_cast<double>(ns) * 1e-9;
}

nlohmann::json FlightRecorder::axes_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i < axes_.size(); ++i) {
    const FlightAxis& a = axes_[i];
    nlohmann::json j = {{"group", a.group}, {"rank", a.rank}, {"size", a.size}, {"started", a.started},
                        {"ended", a.ended}};
    // The axis's newest record: the op a stuck rank is in (or did last).
    for (int64_t t = next_ - 1; t >= 0 && t >= next_ - capacity_; --t) {
      const FlightEntry& e = ring_[static_cast<size_t>(t % capacity_)];
      if (e.axis != static_cast<int>(i)) continue;
      j["last"] = {{"seq", e.seq}, {"op", e.op}, {"step", e.step}, {"in_flight", e.end_ns == 0}};
      break;
    }
    out[a.name] = j;
  }
  return out;
}

nlohmann::json FlightRecorder::to_json(const std::string& reason) const {
  nlohmann::json out = {{"rank", rank_}, {"host", hostname()}, {"pid", static_cast<int64_t>(::getpid())},
                        {"reason", reason}, {"now_ns", now_ns()}, {"capacity", capacity_}};
  out["axes"] = axes_json();
  std::lock_guard<std::mutex> lock(mu_);
  const auto phase_name = [&](int64_t serial) -> std::string {
    if (serial <= 0 || serial <= phase_serial_ - static_cast<int64_t>(kPhases)) return "";
    const size_t slot = static_cast<size_t>(serial % static_cast<int64_t>(kPhases));
    return slot < phases_.size() ? phases_[slot] : "";
  };
  nlohmann::json records = nlohmann::json::array();
  for (int64_t t = std::max<int64_t>(0, next_ - capacity_); t < next_; ++t) {
    const FlightEntry& e = ring_[static_cast<size_t>(t % capacity_)];
    records.push_back({{"axis", axes_[static_cast<size_t>(e.axis)].name},
                       {"seq", e.seq},
                       {"op", e.op},
                       {"peer", e.peer},
                       {"bytes", e.bytes},
                       {"dtype", e.dtype},
                       {"start_ns", e.start_ns},
                       {"end_ns", e.end_ns},
                       {"step", e.step},
                       {"phase", phase_name(e.phase)}});
  }
  out["records"] = std::move(records);
  return out;
}

bool FlightRecorder::write(const std::string& dir, const std::string& reason) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return false;
  const fs::path path = fs::path(dir) / flight_file_name(rank_);
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << to_json(reason).dump(1) << "\n";
    if (!out.good()) return false;
  }
  fs::rename(tmp, path, ec);
  return !ec;
}

}  // namespace meshtrain
