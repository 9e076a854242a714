#include "meshtrain/config/config.h"

namespace meshtrain {

std::string Config::run_dir() const {
  if (output_dir.empty()) return name;
  return output_dir.back() == '/' ? output_dir + name : output_dir + "/" + name;
}

}  // namespace meshtrain
