#include "meshtrain/core/watchdog.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

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
  if (timeout_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  ++beats_;
  last_ = std::chrono::steady_clock::now();
}

void Watchdog::write_heartbeat(int64_t beats, const std::string& phase) {
  if (dir_.empty()) return;
  // Written aside and renamed, so a reader never sees half a record.
  const std::string path = heartbeat_file(dir_, rank_);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << beats << "\n" << phase << "\n" << host_ << "\n" << ::getpid() << "\n" << job_ << "\n";
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
  int64_t written = -1;
  while (!stop_) {
    if (beats_ != written) {
      written = beats_;
      const std::string phase = phase_;
      lock.unlock();  // file I/O without holding up beat()
      write_heartbeat(written, phase);
      lock.lock();
      continue;
    }
    const auto deadline = last_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(timeout_));
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string msg = "watchdog: rank " + std::to_string(rank_) + " (host " + host_ + ", pid " +
                        std::to_string(::getpid()) + ") made no progress for " +
                        std::to_string(static_cast<int64_t>(timeout_)) + " s in '" + phase_ + "'";
      if (!dir_.empty() && world_size_ > 1) msg += "; " + describe_stuck_ranks(read_heartbeats());
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
