#include "meshtrain/metrics/metrics.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "meshtrain/core/check.h"
#include "meshtrain/core/fs.h"
#include "meshtrain/core/log.h"

namespace meshtrain {

namespace {

void scalars_to_tb(TensorBoardWriter& tb, const std::string& tag, const nlohmann::json& v,
                   int64_t step) {
  if (v.is_number()) {
    tb.add_scalar(tag, v.get<double>(), step);
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) scalars_to_tb(tb, tag + "/" + std::to_string(i), v[i], step);
  } else if (v.is_object()) {
    for (const auto& [k, sub] : v.items()) scalars_to_tb(tb, tag + "/" + k, sub, step);
  }
  // Strings, booleans and nulls have no place on a TensorBoard chart.
}

// A crash or a full disk mid-write leaves a last line without its newline;
// appending after it would glue the next row onto it. Cut back to the end of
// the last complete line.
void drop_partial_last_line(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size == 0) return;
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "cannot read '", path, "' to check its last line");
  uintmax_t end = size;  // bytes to keep
  char buf[4096];
  while (end > 0) {
    const uintmax_t chunk = std::min<uintmax_t>(end, sizeof(buf));
    in.seekg(static_cast<std::streamoff>(end - chunk));
    in.read(buf, static_cast<std::streamsize>(chunk));
    MT_CHECK(in.good(), "cannot read '", path, "' to check its last line");
    uintmax_t i = chunk;
    while (i > 0 && buf[i - 1] != '\n') --i;
    if (i > 0) {
      end = end - chunk + i;
      break;
    }
    end -= chunk;
  }
  if (end == size) return;
  std::filesystem::resize_file(path, end, ec);
  MT_CHECK(!ec, "'", path, "' ends with a partial line (", size - end, " bytes) that cannot be removed: ",
           ec.message());
  spdlog::warn("removed a partial last line ({} bytes, from an interrupted write) from {}", size - end, path);
}

// Keeps the rows of `path` whose step is <= last_step (and any line that is
// not a row, which is not ours to judge): streamed to path.tmp, flushed and
// renamed over path, so a crash leaves either the old file or the new one.
void drop_rows_after(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in.good()) return;  // no file yet
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  MT_CHECK(out.good(), "cannot create '", tmp, "' to drop the rows after step ", last_step, " from ", path);
  int64_t dropped = 0;
  for (std::string line; std::getline(in, line);) {
    int64_t step = -1;
    try {
      const auto row = nlohmann::json::parse(line);
      if (row.is_object() && row.contains("step") && row["step"].is_number_integer()) step = row["step"].get<int64_t>();
    } catch (const nlohmann::json::exception&) {
    }
    if (step > last_step) ++dropped;
    else out << line << '\n';
  }
  in.close();
  out.flush();
  const bool written = out.good();
  out.close();
  std::error_code ec;
  if (dropped == 0) {
    std::filesystem::remove(tmp, ec);
    return;
  }
  MT_CHECK(written, "cannot write '", tmp, "': ", write_failure(errno));
  std::filesystem::rename(tmp, path, ec);
  MT_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
  spdlog::info("{}: dropped {} row(s) after step {}, the step this run continues from (they are trained again)", path,
               dropped, last_step);
}

// --fresh: the old history (metrics.jsonl, the tb/ folder) is kept under
// another name, never appended to; TensorBoard shows a tb.superseded folder
// as a run of its own.
void set_aside(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  // Nothing to keep: the start-up check creates tb/ before this runs.
  if (std::filesystem::is_directory(path, ec) && std::filesystem::is_empty(path, ec)) return;
  std::string to = path + ".superseded";
  for (int i = 1; std::filesystem::exists(to, ec); ++i) to = path + ".superseded." + std::to_string(i);
  std::filesystem::rename(path, to, ec);
  MT_CHECK(!ec, "cannot rename '", path, "' to '", to, "': ", ec.message());
  spdlog::info("--fresh: kept the earlier run's {} as {}", path, to);
}

}  // namespace

MetricsLogger::MetricsLogger(const std::string& run_dir, bool enabled, bool tensorboard, MetricsStart start)
    : enabled_(enabled) {
  const std::filesystem::path dir(run_dir);
  jsonl_path_ = (dir / "metrics.jsonl").string();
  if (!enabled_) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, "cannot create run directory '", run_dir, "': ", ec.message());
  // Append: a resumed run continues the same history instead of erasing it.
  drop_partial_last_line(jsonl_path_);
  if (start.fresh) {
    set_aside(jsonl_path_);
    if (tensorboard) set_aside((dir / "tb").string());
  } else if (start.step >= 0) {
    drop_rows_after(jsonl_path_, start.step);
  }
  jsonl_.open(jsonl_path_, std::ios::app);
  MT_CHECK(jsonl_.good(), "cannot open '", jsonl_path_, "' for appending");
  if (!tensorboard) return;
  tb_ = std::make_unique<TensorBoardWriter>((dir / "tb").string());
  // TensorBoard reads every event file of the folder: this START tells it to
  // forget the older files' events from the first step this run logs.
  if (start.fresh || start.step >= 0) {
    tb_->add_session_start((start.fresh ? 0 : start.step) + 1);
    tb_->flush();
  }
}

void MetricsLogger::log(const nlohmann::json& row) {
  if (!enabled_) return;
  MT_CHECK(row.is_object(), "metrics row must be a JSON object, got: ", row.dump());
  MT_CHECK(row.contains("step") && row["step"].is_number_integer(),
           "metrics row needs an integer \"step\", got: ", row.dump());
  // One write per line, so a reader tailing the file never sees half a row.
  const std::string line = row.dump() + "\n";
  jsonl_.write(line.data(), static_cast<std::streamsize>(line.size()));
  jsonl_.flush();
  MT_CHECK(jsonl_.good(), "cannot write '", jsonl_path_, "': ", write_failure(errno));
  if (!tb_) return;
  const auto step = row["step"].get<int64_t>();
  for (const auto& [key, value] : row.items())
    if (key != "step") scalars_to_tb(*tb_, key, value, step);
  tb_->flush();
}

}  // namespace meshtrain
