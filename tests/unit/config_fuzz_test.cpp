// A fuzzer for config files and --set overrides (fixed seed, so every run
// tries the same cases): each case mutates configs/tiny.json -- a key set to a
// value of a hostile kind (negative, huge, 1e400, NaN-like text, wrong type,
// empty, control characters), a key removed or unknown, the text cut or
// garbled -- and loads it. A case passes when the config loads, or when a
// meshtrain::Error names a config key, a --set or the file. Anything else (a
// raw nlohmann exception, a message that names nothing, a crash, a hang under
// ctest's timeout) fails the test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kCases = 400;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Values a user might write by mistake, as JSON text.
const std::vector<std::string>& hostile_values() {
  static const std::vector<std::string> v = {
      "-1", "-5", "0", "1", "2", "3", "7", "-0.5", "0.5", "1.5", "1e400", "-1e400", "1e10", "1e308", "1e-400",
      "99999999999999999999", "-99999999999999999999", "9223372036854775807", "9223372036854775808", "4.0",
      "\"\"", "\"abc\"", "\"4\"", "\"a\\u0000b\"", "\"a\\nb\"", "\"../x\"", "true", "false", "null", "[]", "[1]",
      "[1,1,1]", "[0,1,1]", "[-1,2,1]", "[2,1,2,1]", "[1,2,3]", "{}", "{\"a\":1}", "\"mla\"", "\"moe\"", "\"cuda\"",
      "\"bfloat16\"", "\"stop\"", "65537", "1000000000", "86401"};
  return v;
}

// Does an error message name where the problem is?
bool names_something(const std::string& msg, const std::vector<std::string>& keys) {
  if (msg.find("config file") != std::string::npos || msg.find("--set") != std::string::npos) return true;
  for (const auto& k : keys) {
    const auto leaf = k.substr(k.rfind('.') == std::string::npos ? 0 : k.rfind('.') + 1);
    if (msg.find(k) != std::string::npos || msg.find(leaf) != std::string::npos) return true;
  }
  return false;
}

class ConfigFuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_config_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ConfigFuzz, EveryCaseLoadsOrNamesTheKey) {
  const std::string base_text = read_text(std::string(MT_SOURCE_DIR) + "/configs/tiny.json");
  const json base = json::parse(base_text);
  // Every key the config has, dotted.
  std::vector<std::string> known;
  const json defaults = to_json(Config{});  // alive for the loop: items() only refers to it
  for (const auto& [k, v] : defaults.items()) {
    if (!v.is_object()) known.push_back(k);
    else
      for (const auto& [sub, x] : v.items()) known.push_back(k + "." + sub);
  }
  std::mt19937_64 rng(20261123);
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const auto& values = hostile_values();

  int loaded = 0, refused = 0;
  std::vector<std::string> failures;
  for (int i = 0; i < kCases; ++i) {
    json j = base;
    std::vector<std::string> sets;
    std::string text;
    std::string what;
    const int kind = static_cast<int>(pick(10));
    if (kind <= 4) {  // one to three keys in the file set to hostile values
      for (size_t n = 1 + pick(3); n > 0; --n) {
        const std::string& key = known[pick(known.size())];
        const std::string& value = values[pick(values.size())];
        const auto dot = key.find('.');
        // 1e400 and friends do not parse: spliced into the text instead.
        const json v = json::parse(value, nullptr, false);
        json& scope = dot == std::string::npos ? j : j[key.substr(0, dot)];
        const std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
        scope[leaf] = v.is_discarded() ? json("@@RAW@@") : v;
        what += key + "=" + value + " ";
        if (v.is_discarded()) {
          text = j.dump();
          const auto at = text.find("\"@@RAW@@\"");
          text.replace(at, 9, value);
          j = json();  // the text is the case now
          break;
        }
      }
    } else if (kind <= 6) {  // the same through --set
      for (size_t n = 1 + pick(3); n > 0; --n) {
        sets.push_back(known[pick(known.size())] + "=" + values[pick(values.size())]);
        what += "--set " + sets.back() + " ";
      }
    } else if (kind == 7) {  // a key removed, or an unknown one added
      const std::string& key = known[pick(known.size())];
      const auto dot = key.find('.');
      if (pick(2)) {
        if (dot == std::string::npos) j.erase(key);
        else if (j.contains(key.substr(0, dot))) j[key.substr(0, dot)].erase(key.substr(dot + 1));
        what = "without " + key;
      } else {
        j[dot == std::string::npos ? "extra_key" : key.substr(0, dot)]["n_hed"] = 4;
        what = "unknown key next to " + key;
      }
    } else {  // the text cut short or garbled
      text = base_text;
      const size_t at = pick(text.size());
      if (kind == 8) text.resize(at);
      else text.insert(at, std::string(1, "{}[],:\"\\x0-e"[pick(13)]));
      what = "text changed at byte " + std::to_string(at);
    }
    if (text.empty()) text = j.dump(1);
    const std::string path = (dir_ / ("case_" + std::to_string(i) + ".json")).string();
    std::ofstream(path) << text;
    try {
      load_config(path, sets);
      ++loaded;
    } catch (const Error& e) {
      ++refused;
      std::vector<std::string> mentioned = known;
      mentioned.push_back(path);
      if (!names_something(e.what(), mentioned)) failures.push_back("case " + std::to_string(i) + " (" + what +
                                                                    "): message names no key: " + e.what());
    } catch (const std::exception& e) {
      failures.push_back("case " + std::to_string(i) + " (" + what + "): not a meshtrain::Error: " + e.what());
    }
  }
  std::printf("config fuzz: %d cases, %d loaded, %d refused with a message naming the key, %zu failures\n", kCases,
              loaded, refused, failures.size());
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, kCases / 4);
}

}  // namespace
}  // namespace meshtrain
