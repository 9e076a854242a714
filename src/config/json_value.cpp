#include "json_value.h"

#include <cmath>
#include <limits>

#include "meshtrain/core/check.h"

namespace meshtrain::schema {

using nlohmann::json;

std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " (" + text + ")";
}

namespace {

[[noreturn]] void wrong_type(const json& v, const std::string& path, const char* expected) {
  MT_FAIL("config key '", path, "': expected ", expected, ", found ", describe(v));
}

// JSON writers (Python's json among them) may write 4 as 4.0 or 1e3; those are
// whole numbers and accepted, 1.5 is not.
int64_t integral(const json& v, const std::string& path, bool allow_negative) {
  const char* expected = allow_negative ? "an integer" : "a non-negative integer";
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) wrong_type(v, path, expected);
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    auto i = v.get<int64_t>();
    if (!allow_negative && i < 0) wrong_type(v, path, expected);
    return i;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^63 is exactly representable; anything at or past it does not fit int64.
    bool fits = std::isfinite(d) && std::trunc(d) == d && d >= -9.223372036854775808e18 &&
                d < 9.223372036854775808e18;
    if (!fits || (!allow_negative && d < 0)) wrong_type(v, path, expected);
    return static_cast<int64_t>(d);
  }
  wrong_type(v, path, expected);
}

}  // namespace

void read_value(const json& v, const std::string& path, int64_t& out) { out = integral(v, path, true); }

void read_value(const json& v, const std::string& path, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return;
  }
  out = static_cast<uint64_t>(integral(v, path, false));
}

void read_value(const json& v, const std::string& path, double& out) {
  if (!v.is_number()) wrong_type(v, path, "a number");
  out = v.get<double>();
}

void read_value(const json& v, const std::string& path, bool& out) {
  if (!v.is_boolean()) wrong_type(v, path, "a boolean (true or false)");
  out = v.get<bool>();
}

void read_value(const json& v, const std::string& path, std::string& out) {
  if (!v.is_string()) wrong_type(v, path, "a string");
  out = v.get<std::string>();
}

void read_value(const json& v, const std::string& path, std::array<int64_t, 3>& out) {
  if (!v.is_array() || v.size() != 3) wrong_type(v, path, "an array of 3 integers [dp, pp, tp]");
  for (size_t i = 0; i < 3; ++i) out[i] = integral(v[i], path + "[" + std::to_string(i) + "]", true);
}

void read_value(const json& v, const std::string& path, std::vector<DatasetWeight>& out) {
  if (!v.is_array()) wrong_type(v, path, "an array of {\"path\": folder, \"weight\": number}");
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    const json& e = v[i];
    if (!e.is_object()) wrong_type(e, at, "an object {\"path\": folder, \"weight\": number}");
    for (auto it = e.begin(); it != e.end(); ++it) {
      MT_CHECK(it.key() == "path" || it.key() == "weight", at, ": unknown key '", it.key(),
               "' (expected path and weight)");
    }
    DatasetWeight d;
    MT_CHECK(e.contains("path"), at, ": missing \"path\"");
    read_value(e["path"], at + ".path", d.path);
    if (e.contains("weight")) read_value(e["weight"], at + ".weight", d.weight);
    out.push_back(d);
  }
}

// Worded like validate()'s range checks: the key, then what it allows.
void not_a_choice(const std::string& path, const std::string& allowed, const std::string& got) {
  MT_FAIL(path, " must be one of {", allowed, "}, got '", got, "'");
}

void read_value(const json& v, const std::string& path, std::vector<double>& out) {
  if (!v.is_array()) wrong_type(v, path, "an array of numbers");
  out.assign(v.size(), 0.0);
  for (size_t i = 0; i < v.size(); ++i) read_value(v[i], path + "[" + std::to_string(i) + "]", out[i]);
}

void read_value(const json& v, const std::string& path, std::vector<int64_t>& out) {
  if (!v.is_array()) wrong_type(v, path, "an array of integers");
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) out.push_back(integral(v[i], path + "[" + std::to_string(i) + "]", true));
}

}  // namespace meshtrain::schema
