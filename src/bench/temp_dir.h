#pragma once
// A fresh temporary folder, removed when the object dies (also on errors), so
// benches leave no metrics or checkpoints behind. Private to src/train.
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "meshtrain/core/check.h"

namespace meshtrain {

class TempDir {
 public:
  TempDir() {
    namespace fs = std::filesystem;
    std::string pattern = (fs::temp_directory_path() / "meshtrain-bench-XXXXXX").string();
    MT_CHECK(mkdtemp(pattern.data()) != nullptr, "bench: cannot create a temporary run dir under ",
             fs::temp_directory_path().string());
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace meshtrain
