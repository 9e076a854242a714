#include "meshtrain/core/flight_compare.h"

#include <climits>
#include <cstdint>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "meshtrain/core/flight_recorder.h"
#include "meshtrain/core/json_read.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// The members of one axis group: rank -> that axis's summary.
using Group = std::map<int, nlohmann::json>;

// (axis name, group) -> members, over every known rank.
std::map<std::pair<std::string, int>, Group> groups_of(const std::vector<RankFlight>& ranks) {
  std::map<std::pair<std::string, int>, Group> out;
  for (const auto& r : ranks) {
    if (!r.known || !r.axes.is_object()) continue;
    for (const auto& [name, a] : r.axes.items())
      if (a.value("size", 1) > 1) out[{name, a.value("group", 0)}][r.rank] = a;
  }
  return out;
}

std::string join_ranks(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string op_at(const nlohmann::json& a) {
  if (!a.contains("last")) return "no op yet";
  const auto& l = a["last"];
  return "#" + std::to_string(l.value("seq", int64_t{0})) + " " + l.value("op", std::string("?")) + " (step " +
         std::to_string(l.value("step", int64_t{0})) + (l.value("in_flight", false) ? ", in it" : ", done") + ")";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// The record of `seq` on `axis` in r's ring, or null.
const nlohmann::json* record_at(const RankFlight& r, const std::string& axis, int64_t seq) {
  for (const auto& e : r.records)
    if (e.value("axis", std::string()) == axis && e.value("seq", int64_t{0}) == seq) return &e;
  return nullptr;
}

}  // namespace

bool is_flight_record(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("axes") || !j["axes"].is_object()) return false;
  for (const auto& [name, a] : j["axes"].items())
    if (!a.is_object()) return false;
  if (!j.contains("records")) return true;
  if (!j["records"].is_array()) return false;
  for (const auto& e : j["records"])
    if (!e.is_object()) return false;
  return true;
}

std::string describe_flight_lag(const std::vector<RankFlight>& ranks) {
  std::vector<std::string> found;
  for (const auto& [key, members] : groups_of(ranks)) {
    const std::string& axis = key.first;
    int64_t most = 0;
    for (const auto& [rank, a] : members) most = std::max(most, a.value("started", int64_t{0}));
    std::vector<int> lagging, waiting;
    std::string op_name;
    for (const auto& [rank, a] : members) {
      const int64_t started = a.value("started", int64_t{0});
      if (started < most) lagging.push_back(rank);
      else if (a.contains("last") && a["last"].value("in_flight", false)) {
        waiting.push_back(rank);
        op_name = a["last"].value("op", std::string("?")) + ", step " +
                  std::to_string(a["last"].value("step", int64_t{0}));
      }
    }
    if (lagging.empty()) continue;
    std::string s;
    for (int rank : lagging) {
      const auto& a = members.at(rank);
      const bool in_flight = a.contains("last") && a["last"].value("in_flight", false);
      s += (s.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) +
           (in_flight ? " is stuck in " + axis + " op " + op_at(a) + " and never entered " + axis + " op #" +
                            std::to_string(most)
                      : " never entered " + axis + " op #" + std::to_string(most) + " (its last: " + op_at(a) + ")");
    }
    if (!waiting.empty())
      s += "; rank(s) " + join_ranks(waiting) + " wait in " + axis + " op #" + std::to_string(most) + " (" + op_name + ")";
    found.push_back(s);
  }
  // Ranks nothing is known of: stopped before their first heartbeat, or another host's files are not shared.
  std::vector<int> unknown;
  for (const auto& r : ranks)
    if (!r.known) unknown.push_back(r.rank);
  std::string out;
  for (const auto& f : found) out += (out.empty() ? "" : "; ") + f;
  if (!out.empty() && !unknown.empty()) out += "; no flight record from rank(s) " + join_ranks(unknown);
  for (const auto& r : ranks)
    if (!out.empty() && !r.problem.empty()) out += "; " + r.problem;
  return out;
}

std::string compare_flights(const std::vector<RankFlight>& ranks) {
  std::ostringstream os;
  std::vector<int> unread;  // ranks nothing could be read of, or whose file is unreadable
  for (const auto& r : ranks) {
    os << "rank " << r.rank << ": " << (r.known ? "from its " + r.source : std::string("no record"))
       << (r.problem.empty() ? "" : " (" + r.problem + ")") << "\n";
    if (!r.known || !r.problem.empty()) unread.push_back(r.rank);
  }
  std::map<int, const RankFlight*> by_rank;
  for (const auto& r : ranks) by_rank[r.rank] = &r;
  for (const auto& [key, members] : groups_of(ranks)) {
    const auto& [axis, group] = key;
    os << "axis " << axis << " group " << group << ":";
    int64_t least = INT64_MAX, most = 0;
    for (const auto& [rank, a] : members) {
      const int64_t started = a.value("started", int64_t{0});
      least = std::min(least, started);
      most = std::max(most, started);
      os << " rank " << rank << " " << op_at(a) << ";";
    }
    os << "\n";
    // The first sequence number where the members differ: one never entered
    // it, or their rings hold different ops there. Ops before the oldest
    // record every ring still holds cannot be compared.
    int64_t first = -1;
    std::string what;
    int64_t from = 1;
    for (const auto& [rank, a] : members) {
      int64_t oldest = INT64_MAX;
      for (const auto& e : by_rank[rank]->records)
        if (e.value("axis", std::string()) == axis) oldest = std::min(oldest, e.value("seq", int64_t{0}));
      if (oldest != INT64_MAX) from = std::max(from, oldest);
    }
    for (int64_t s = from; s <= most && first < 0; ++s) {
      std::map<std::string, std::vector<int>> ops;
      for (const auto& [rank, a] : members) {
        if (a.value("started", int64_t{0}) < s) {
          ops["(never entered)"].push_back(rank);
          continue;
        }
        const nlohmann::json* e = record_at(*by_rank[rank], axis, s);
        if (!e) continue;  // no ring (a heartbeat summary): nothing to compare
        ops[e->value("op", std::string("?")) + (e->value("end_ns", int64_t{0}) == 0 ? " (in it)" : "")].push_back(rank);
      }
      if (ops.size() < 2) continue;
      first = s;
      for (const auto& [op, rs] : ops) what += "  " + op + ": rank(s) " + join_ranks(rs) + "\n";
    }
    if (first < 0)
      os << "  no divergence" << (least == most ? "" : " in the ops the rings hold") << " (ops #" << from << " to #"
         << most << ")\n";
    else
      os << "  first diverging op: #" << first << "\n" << what;
  }
  const std::string lag = describe_flight_lag(ranks);
  if (!lag.empty()) os << "summary: " << lag << "\n";
  else if (unread.empty()) os << "no rank lags on any axis\n";
  // What was not read is not compared: "no lag" would be a guess.
  else os << "no lag among the records read; rank(s) " << join_ranks(unread) << " could not be compared\n";
  return os.str();
}

std::vector<RankFlight> read_flights(const std::string& run_dir, int world_size) {
  const fs::path flight = fs::path(run_dir) / "flight", beats = fs::path(run_dir) / "heartbeats";
  if (world_size <= 0) {
    world_size = 0;
    for (const fs::path& d : {flight, beats}) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(d, ec)) {
        const std::string n = e.path().filename().string();
        int r = -1;
        if (std::sscanf(n.c_str(), "rank_%d", &r) == 1 && n.find(".tmp") == std::string::npos)
          world_size = std::max(world_size, r + 1);
      }
    }
  }
  std::vector<RankFlight> out;
  for (int r = 0; r < world_size; ++r) {
    RankFlight f;
    f.rank = r;
    const fs::path file = flight / flight_file_name(r);
    std::error_code ec;
    nlohmann::json j;
    if (fs::exists(file, ec)) {
      std::string why;
      j = try_parse_json_text(read_text(file), &why);
      if (why.empty() && !is_flight_record(j))
        why = "it is not a flight record (an \"axes\" object of objects, \"records\" a list of objects)";
      if (!why.empty()) f.problem = "flight file " + file.string() + " cannot be read: " + why;
    }
    if (f.problem.empty() && j.is_object() && j.contains("axes")) {
      f.known = true;
      f.source = "flight file";
      f.axes = j["axes"];
      f.records = j.value("records", nlohmann::json::array());
    } else {
      // A heartbeat's sixth line is the rank's axes summary (core/watchdog.cpp).
      char name[32];
      std::snprintf(name, sizeof(name), "rank_%05d", r);
      std::ifstream hb(beats / name);
      std::string line;
      for (int i = 0; i < 6 && std::getline(hb, line); ++i) {
      }
      std::string why;
      const nlohmann::json a = try_parse_json_text(line, &why);
      if (!line.empty() && is_flight_record(nlohmann::json{{"axes", a}})) {
        f.known = true;
        f.source = "heartbeat";
        f.axes = a;
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace meshtrain
