// The console line and the ETA: what a person watching a run reads.
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "meshtrain/metrics/metrics.h"

namespace meshtrain {

namespace {

std::string printf_str(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// 12345.678 -> "12,345.68", like Python's f"{x:,.2f}" in Jaxformer's line.
std::string with_thousands(double v) {
  if (!std::isfinite(v)) return printf_str("%.2f", v);
  std::string s = printf_str("%.2f", std::fabs(v));
  const size_t dot = s.find('.');
  for (size_t i = dot; i > 3; i -= 3) s.insert(i - 3, ",");
  return (v < 0 ? "-" : "") + s;
}

}  // namespace

std::string format_step_line(const nlohmann::json& row) {
  struct Field {
    const char* key;
    const char* label;
    std::string (*fmt)(double);
  };
  static const Field kFields[] = {
      {"loss", "Loss", [](double v) { return printf_str("%.4f", v); }},
      {"val_loss", "Eval Loss", [](double v) { return printf_str("%.4f", v); }},
      {"aux_loss", "aux", [](double v) { return printf_str("%.4f", v); }},
      {"grad_norm", "grad norm", [](double v) { return printf_str("%.3f", v); }},
      {"lr", "lr", [](double v) { return printf_str("%.2e", v); }},
      {"tokens_per_sec", "tk/s", with_thousands},
  };
  std::string line;
  auto append = [&line](const std::string& part) { line += (line.empty() ? "" : ", ") + part; };
  if (row.is_object() && row.contains("step") && row["step"].is_number())
    append("Step " + std::to_string(row["step"].get<int64_t>()));
  for (const Field& f : kFields) {
    if (!row.is_object() || !row.contains(f.key) || !row[f.key].is_number()) continue;
    append(std::string(f.label) + ": " + f.fmt(row[f.key].get<double>()));
  }
  return line;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[64];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else if (s < 86400) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s % 3600 / 60));
  else std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(s / 86400), static_cast<long long>(s % 86400 / 3600));
  return buf;
}

Progress::Progress(int64_t start_step, int64_t total_steps)
    : start_step_(start_step), total_steps_(total_steps) {}

std::string Progress::eta(int64_t step, double elapsed_seconds) const {
  const int64_t done = step - start_step_;
  if (done <= 0 || elapsed_seconds <= 0) return "ETA ?";
  const int64_t left = total_steps_ > step ? total_steps_ - step : 0;
  return "ETA " + format_duration(elapsed_seconds / static_cast<double>(done) * static_cast<double>(left));
}

bool Progress::stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

}  // namespace meshtrain
