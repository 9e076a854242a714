#pragma once
// Reading a whole JSON file with errors that name it (tokenizer files of both
// formats go through here).
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/core/json_read.h"
#include "meshtrain/core/paths.h"

namespace meshtrain::detail {

inline nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot open ", what, " ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_json_text(text.str(), what, path);
}

}  // namespace meshtrain::detail
