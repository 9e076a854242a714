#pragma once
// CLI11 validators for meshtrain's flags (src/main.cpp): numbers checked as
// written, with the flag named by CLI11 before the message.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace meshtrain {

// Integers as written: every character a digit (after an optional sign), the
// value fits int64 (CLI11 alone would saturate 99999999999999999999 to
// INT64_MAX) and is >= lo. CLI11 puts the flag's name before the message.
inline CLI::Validator integer_at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data() + (text.size() > 1 && text[0] == '+'), end, v);
        if (ec == std::errc::result_out_of_range) return "value " + text + " does not fit a 64-bit integer";
        if (ec != std::errc() || p != end || text.empty()) return "value '" + text + "' is not an integer";
        if (v < lo) return "value " + text + " must be >= " + std::to_string(lo);
        return "";
      },
      "INT>=" + std::to_string(lo));
}

// A finite number >= lo.
inline CLI::Validator number_at_least(double lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0') return "value '" + text + "' is not a number";
        if (errno == ERANGE || !std::isfinite(v)) return "value " + text + " is out of range";
        if (v < lo) return "value " + text + " must be >= " + std::to_string(lo);
        return "";
      },
      "NUMBER>=" + std::to_string(lo));
}

// A string flag must say something: --name "" is a mistake, not "the default".
inline CLI::Validator non_empty() {
  return CLI::Validator([](std::string& text) { return text.empty() ? std::string("must not be empty") : ""; }, "TEXT");
}

}  // namespace meshtrain
