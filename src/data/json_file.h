#pragma once
// Reading a whole JSON file with errors that name it (tokenizer files of both
// formats go through here).
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/core/paths.h"

namespace meshtrain::detail {

inline nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  std::ifstream in(path);
  MT_CHECK(in, "cannot open ", what, " ", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL(what, " ", path, " is not valid JSON: ", e.what());
  }
}

}  // namespace meshtrain::detail
