#include "meshtrain/train/shared_run_dir.h"

#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "meshtrain/core/check.h"
#include "meshtrain/core/host.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kHostBytes = 256;
constexpr auto kReadPatience = std::chrono::seconds(3);

fs::path probe_path(const std::string& run_dir, int64_t token) {
  return fs::path(run_dir) / (".shared-storage-probe-" + std::to_string(token));
}

// Rank 0: the probe written (its token), or the reason it could not be.
int64_t write_probe(const std::string& run_dir, std::string& error) {
  std::random_device rd;
  const int64_t token =
      static_cast<int64_t>((static_cast<uint64_t>(rd()) << 31 ^ rd() ^ static_cast<uint64_t>(::getpid())) &
                           ((uint64_t{1} << 62) - 1)) | 1;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) {
    error = "cannot create the run dir " + run_dir + ": " + ec.message();
    return 0;
  }
  std::ofstream out(probe_path(run_dir, token), std::ios::trunc);
  out << token << "\n";
  out.close();
  if (!out) {
    error = "cannot write a file into the run dir " + run_dir + " (" + probe_path(run_dir, token).string() + ")";
    return 0;
  }
  return token;
}

bool reads_probe(const std::string& run_dir, int64_t token) {
  const auto until = std::chrono::steady_clock::now() + kReadPatience;
  for (;;) {
    std::ifstream in(probe_path(run_dir, token));
    int64_t seen = 0;
    if (in >> seen && seen == token) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

void check_run_dir_shared(const std::string& run_dir, Communicator& world) {
  std::string error;
  const int64_t token = world.rank() == 0 ? write_probe(run_dir, error) : 0;
  // Max over ranks: rank 0's token reaches everyone, and the write is done.
  at::Tensor t = at::tensor({token, static_cast<int64_t>(!error.empty())}, at::kLong);
  world.all_reduce(t, ReduceOp::Max);
  MT_CHECK(t[1].item<int64_t>() == 0, world.rank() == 0 ? error : "rank 0 could not write into the run dir " + run_dir);
  const int64_t shared = t[0].item<int64_t>();

  // One row per rank: [sees it?, host name...].
  std::string row(static_cast<size_t>(kHostBytes), '\0');
  row[0] = reads_probe(run_dir, shared) ? 1 : 0;
  const std::string host = hostname();
  std::memcpy(row.data() + 1, host.data(), std::min<size_t>(host.size(), kHostBytes - 2));
  const at::Tensor mine = at::from_blob(row.data(), {kHostBytes}, at::kByte).clone();
  const at::Tensor all = world.all_gather(mine, 0);  // also: every rank has read before rank 0 removes it
  if (world.rank() == 0) {
    std::error_code ec;
    fs::remove(probe_path(run_dir, shared), ec);
  }

  std::map<std::string, std::string> blind;  // host -> its ranks that cannot see the probe
  std::string host0;
  const auto* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  for (int r = 0; r < world.size(); ++r) {
    const char* rec = p + r * kHostBytes;
    const std::string h(rec + 1, strnlen(rec + 1, kHostBytes - 1));
    if (r == 0) host0 = h;
    if (rec[0] == 1) continue;
    std::string& ranks = blind[h];
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (blind.empty()) return;
  std::string who;
  for (const auto& [h, ranks] : blind) who += (who.empty() ? "" : "; ") + h + " (rank " + ranks + ")";
  MT_FAIL("the run dir ", run_dir, " is not on shared storage: rank 0 on host ", host0,
          " wrote a probe file into it that these hosts cannot see: ", who,
          ". Every rank writes its checkpoint shards into the run dir, so output_dir must be a folder on shared "
          "storage (NFS, Lustre, ...) mounted at the same path on every host: pass --output_dir /shared/path");
}

}  // namespace meshtrain
