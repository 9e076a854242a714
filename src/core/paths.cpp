#include "meshtrain/core/paths.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "meshtrain/core/check.h"

namespace fs = std::filesystem;

namespace meshtrain {

namespace {

// Absolute, symlinks resolved as far as the path exists, "." and ".." gone.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) r = fs::absolute(p).lexically_normal();
  if (r.filename().empty() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();  // "dir/" names dir
  return r;
}

}  // namespace

std::string non_regular_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "missing";
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

void require_regular_file(const std::string& path, const std::string& what) {
  const std::string kind = non_regular_kind(path);
  if (kind.empty()) return;
  MT_CHECK(kind != "missing", what, " ", path, " does not exist");
  MT_FAIL(what, " ", path, " is ", kind, ", not a regular file: meshtrain reads only regular files (a pipe or a ",
          "device would block or never end; write it to a file first)");
}

void require_writable_folder(const std::string& folder, const std::string& what) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  const std::string kind = non_regular_kind(folder);
  MT_CHECK(kind == "a directory", "cannot create the ", what, " ", folder, ": ",
           kind == "missing" ? ec.message() : "it exists and is " + (kind.empty() ? std::string("a file") : kind),
           "; move it away or choose another output_dir / name");
  MT_CHECK(::access(folder.c_str(), W_OK | X_OK) == 0, "the ", what, " ", folder, " is not writable: ",
           std::strerror(errno));
}

bool is_same_or_inside(const std::string& a, const std::string& b) {
  const fs::path ra = resolved(a), rb = resolved(b);
  auto ia = ra.begin();
  for (auto ib = rb.begin(); ib != rb.end(); ++ib, ++ia)
    if (ia == ra.end() || *ia != *ib) return false;
  return true;
}

std::string manifest_format(const std::string& dir) {
  const fs::path m = fs::path(dir) / "manifest.json";
  std::error_code ec;
  if (!fs::is_regular_file(m, ec)) return "";
  std::ifstream in(m);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string()) return "unmarked";
  return j["format"].get<std::string>();
}

std::string meshtrain_format_name(const std::string& format) {
  if (format == "meshtrain-data") return "a meshtrain dataset (prepare-data's output)";
  if (format == "meshtrain-checkpoint") return "a meshtrain checkpoint";
  return "";
}

std::string enclosing_meshtrain_folder(const std::string& path, bool include_self) {
  fs::path p = resolved(path);
  if (!include_self) p = p.parent_path();
  for (;; p = p.parent_path()) {
    if (!meshtrain_format_name(manifest_format(p.string())).empty()) return p.string();
    if (p == p.root_path() || p.parent_path() == p) return "";
  }
}

bool process_alive(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::vector<std::string> remove_dead_staging(const fs::path& final_path,
                                             const std::function<bool(const fs::path&)>& ours) {
  std::vector<std::string> removed;
  const fs::path f = resolved(final_path.string());
  const fs::path parent = f.parent_path();
  const std::string prefix = f.filename().string() + ".tmp-";
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return removed;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (process_alive(std::stol(digits)) || !ours(e.path())) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) removed.push_back(e.path().string());
  }
  return removed;
}

}  // namespace meshtrain
