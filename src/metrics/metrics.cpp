#include "meshtrain/metrics/metrics.h"

#include <filesystem>

#include "meshtrain/core/check.h"

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

}  // namespace

MetricsLogger::MetricsLogger(const std::string& run_dir, bool enabled, bool tensorboard)
    : enabled_(enabled) {
  const std::filesystem::path dir(run_dir);
  jsonl_path_ = (dir / "metrics.jsonl").string();
  if (!enabled_) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, "cannot create run directory '", run_dir, "': ", ec.message());
  // Append: a resumed run continues the same history instead of erasing it.
  jsonl_.open(jsonl_path_, std::ios::app);
  MT_CHECK(jsonl_.good(), "cannot open '", jsonl_path_, "' for appending");
  if (tensorboard) tb_ = std::make_unique<TensorBoardWriter>((dir / "tb").string());
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
  MT_CHECK(jsonl_.good(), "cannot write '", jsonl_path_, "' (disk full?)");
  if (!tb_) return;
  const auto step = row["step"].get<int64_t>();
  for (const auto& [key, value] : row.items())
    if (key != "step") scalars_to_tb(*tb_, key, value, step);
  tb_->flush();
}

}  // namespace meshtrain
