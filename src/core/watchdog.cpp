#include "meshtrain/core/watchdog.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iostream>
#include <map>
#include <sstream>

#include "meshtrain/core/flight_compare.h"
#include "meshtrain/core/json_read.h"
#include "meshtrain/core/host.h"
#include "meshtrain/core/log.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

std::string heartbeat_file(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d", rank);
  return (fs::path(dir) / name).string();
}

}  // namespace

std::string describe_stuck_ranks(const std::vector<RankProgress>& ranks) {
  int64_t most = -1;
  for (const auto& r : ranks)
    if (r.known) most = std::max(most, r.beats);
  std::vector<std::string> behind, silent;
  for (const auto& r : ranks) {
    if (!r.known) silent.push_back(std::to_string(r.rank));
    else if (r.beats < most) behind.push_back("rank " + std::to_string(r.rank) + " (stopped in '" + r.phase + "')" +
                                               (r.host.empty() ? "" : " on host " + r.host + ", pid " + std::to_string(r.pid)));
  }
  const auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
    return out;
  };
  std::string out;
  if (!behind.empty()) out = "stuck: " + join(behind) + "; the other ranks went on and wait for it in a collective";
  if (!silent.empty()) out += std::string(out.empty() ? "" : "; ") + "no progress ever reported by rank(s) " + join(silent);
  if (out.empty() && most >= 0) {
    std::map<std::string, std::vector<std::string>> by_phase;
    for (const auto& r : ranks) by_phase[r.phase].push_back(std::to_string(r.rank));
    out = "no rank is behind the others (a collective no rank completed, or a peer died); ranks by phase:";
    for (const auto& [phase, rs] : by_phase) out += " '" + phase + "': " + join(rs) + ";";
    out.pop_back();
  }
  return out;
}

Watchdog::Watchdog(double timeout_seconds, int rank, int world_size, std::string heartbeat_dir, std::string job)
    : timeout_(timeout_seconds),
      rank_(rank),
      world_size_(world_size),
      dir_(std::move(heartbeat_dir)),
      job_(std::move(job)),
      host_(hostname()),
      last_(std::chrono::steady_clock::now()) {
  if (timeout_ <= 0) return;
  if (!dir_.empty()) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) {
      spdlog::warn("watchdog: cannot create {} ({}): a timeout will not name the stuck rank", dir_, ec.message());
      dir_.clear();
    }
  }
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::beat(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  if (flight_) flight_->set_phase(phase);
  if (timeout_ <= 0) return;
  phase_ = phase;
  ++beats_;
  last_ = std::chrono::steady_clock::now();
}

void Watchdog::attach_flight(FlightRecorder* recorder, const std::string& flight_dir) {
  std::lock_guard<std::mutex> lock(mu_);
  flight_ = recorder && recorder->enabled() ? recorder : nullptr;
  flight_dir_ = flight_dir;
}

bool Watchdog::write_flight(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!flight_ || flight_dir_.empty()) return false;
  nlohmann::json j = flight_->to_json(reason);
  j["job"] = job_;
  const fs::path path = fs::path(flight_dir_) / flight_file_name(rank_), tmp = path.string() + ".tmp";
  std::error_code ec;
  fs::create_directories(flight_dir_, ec);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out.good()) return false;
  }
  fs::rename(tmp, path, ec);
  return !ec;
}

std::string Watchdog::flight_report(const std::vector<RankProgress>& beats) {
  if (!flight_ || flight_dir_.empty()) return "";
  // Called with mu_ held (the timeout path): write this rank's file inline.
  {
    nlohmann::json j = flight_->to_json("watchdog timeout");
    j["job"] = job_;
    std::error_code ec;
    fs::create_directories(flight_dir_, ec);
    std::ofstream(fs::path(flight_dir_) / flight_file_name(rank_), std::ios::trunc) << j.dump(1) << "\n";
  }
  // The other live ranks time out within moments of this one: give them a
  // few seconds to write theirs. A stopped rank writes nothing; its
  // heartbeat's summary stands in for it.
  const auto read_file = [&](int r) {
    // Another rank's file, perhaps half-written or damaged: this thread must
    // not throw (nor recurse through a deep value), so it is checked first.
    std::ifstream in(fs::path(flight_dir_) / flight_file_name(r), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string why;
    nlohmann::json j = try_parse_json_text(text, &why);
    const bool ours = is_flight_record(j) &&
                      (job_.empty() || (j.contains("job") && j["job"].is_string() && j["job"] == job_));
    return ours ? j : nlohmann::json();
  };
  const auto wait_until = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(std::min(10.0, std::max(2.0, timeout_ / 4))));
  std::vector<RankFlight> ranks(static_cast<size_t>(world_size_));
  for (;;) {
    int missing = 0;
    for (int r = 0; r < world_size_; ++r) {
      RankFlight& f = ranks[static_cast<size_t>(r)];
      f.rank = r;
      if (f.source == "flight file") continue;
      const nlohmann::json j = read_file(r);
      if (!j.is_null()) {
        f = {r, true, "flight file", j["axes"], j.value("records", nlohmann::json::array())};
        continue;
      }
      ++missing;
      const RankProgress& b = beats[static_cast<size_t>(r)];
      std::string why;
      const nlohmann::json a = try_parse_json_text(b.flight, &why);
      if (b.known && is_flight_record(nlohmann::json{{"axes", a}}))
        f = {r, true, "heartbeat", a, nlohmann::json::array()};
    }
    if (missing == 0 || std::chrono::steady_clock::now() >= wait_until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const std::string lag = describe_flight_lag(ranks);
  return lag.empty() ? "" : "flight recorder: " + lag + " (records in " + flight_dir_ + ")";
}

void Watchdog::write_heartbeat(int64_t beats, const std::string& phase, const std::string& flight) {
  if (dir_.empty()) return;
  // Written aside and renamed, so a reader never sees half a record.
  const std::string path = heartbeat_file(dir_, rank_);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << beats << "\n" << phase << "\n" << host_ << "\n" << ::getpid() << "\n" << job_ << "\n" << flight << "\n";
    if (!out.good()) return;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
}

std::vector<RankProgress> Watchdog::read_heartbeats() const {
  std::vector<RankProgress> all;
  for (int r = 0; r < world_size_; ++r) {
    RankProgress p;
    p.rank = r;
    std::ifstream in(heartbeat_file(dir_, r));
    std::string pid, job;
    if (in >> p.beats) {
      in.ignore(1);
      std::getline(in, p.phase);
      std::getline(in, p.host);
      std::getline(in, pid);
      std::getline(in, job);
      std::getline(in, p.flight);
      p.pid = std::atoll(pid.c_str());
      // A record of an earlier launch in the same run dir says nothing of this one.
      p.known = job_.empty() || job == job_;
    }
    all.push_back(p);
  }
  return all;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  int64_t written = -1, flight_written = -1;
  auto written_at = std::chrono::steady_clock::now();
  auto woke = written_at;  // this thread wakes at least once a second
  double frozen = 0;       // the longest gap between two wake-ups
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    // A gap far beyond a second: the whole process was frozen (SIGSTOP, a
    // debugger, a suspended VM) and has been let go again.
    frozen = std::max(frozen, std::chrono::duration<double>(now - woke).count());
    woke = now;
    // Ops change the flight summary constantly: rewritten at most once a second.
    const int64_t flight_changes = flight_ ? flight_->changes() : -1;
    const bool flight_due = flight_changes != flight_written &&
                            std::chrono::steady_clock::now() - written_at >= std::chrono::seconds(1);
    if (beats_ != written || flight_due) {
      written = beats_;
      flight_written = flight_changes;
      const std::string phase = phase_;
      FlightRecorder* flight = flight_;
      lock.unlock();  // file I/O without holding up beat()
      write_heartbeat(written, phase, flight ? flight->axes_json().dump() : "");
      lock.lock();
      written_at = std::chrono::steady_clock::now();
      continue;
    }
    const auto deadline = last_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(timeout_));
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string msg = "watchdog: rank " + std::to_string(rank_) + " (host " + host_ + ", pid " +
                        std::to_string(::getpid()) + ") made no progress for " +
                        std::to_string(static_cast<int64_t>(timeout_)) + " s in '" + phase_ + "'";
      if (frozen > 5)
        msg += "; this process was itself frozen for " + std::to_string(static_cast<int64_t>(frozen)) +
               " s (SIGSTOP, a debugger, a suspended machine): it is the rank that stopped, the others' view of it "
               "is the one to read";
      if (!dir_.empty() && world_size_ > 1) {
        const auto beats = read_heartbeats();
        msg += "; " + describe_stuck_ranks(beats);
        if (const std::string f = flight_report(beats); !f.empty()) msg += "; " + f;
      }
      msg += " (watchdog_seconds); aborting";
      spdlog::error("{}", msg);
      std::cerr << msg << std::endl;
      // Not a normal process shutdown: other threads may hold locks; abort() is
      // async-safe enough, and mpirun turns one rank's death into the end of the job.
      std::abort();
    }
    cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(1)));
  }
}

}  // namespace meshtrain
