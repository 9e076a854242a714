// docs/config-reference.md from the code (meshtrain::render_config_reference).
//   config_reference                 print it
//   config_reference --output FILE   write it (scripts/dev/config-reference.sh)
//   config_reference --check FILE    exit 1 when FILE differs (ctest unit.config_reference)
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "meshtrain/config/reference.h"

namespace {

int usage() {
  std::cerr << "usage: config_reference [--output FILE | --check FILE]\n";
  return 2;
}

// The first line where a and b differ (1-based), for the message.
int first_difference(const std::string& a, const std::string& b) {
  std::istringstream x(a), y(b);
  std::string lx, ly;
  for (int line = 1;; ++line) {
    const bool more_x = static_cast<bool>(std::getline(x, lx)), more_y = static_cast<bool>(std::getline(y, ly));
    if (!more_x && !more_y) return 0;
    if (more_x != more_y || lx != ly) return line;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string text = meshtrain::render_config_reference();
  if (argc == 1) {
    std::cout << text;
    return 0;
  }
  if (argc != 3) return usage();
  const std::string mode = argv[1], path = argv[2];
  if (mode == "--output") {
    std::ofstream out(path, std::ios::binary);
    out << text;
    out.close();
    if (!out) {
      std::cerr << "config_reference: cannot write " << path << "\n";
      return 1;
    }
    std::cout << "config_reference: wrote " << path << "\n";
    return 0;
  }
  if (mode != "--check") return usage();
  std::ifstream in(path, std::ios::binary);
  std::ostringstream committed;
  committed << in.rdbuf();
  if (committed.str() == text) {
    std::cout << "config_reference: " << path << " is up to date with the schema\n";
    return 0;
  }
  std::cerr << "config_reference: " << path << " is stale: it differs from what the config schema gives (first at line "
            << first_difference(committed.str(), text)
            << "); run scripts/dev/config-reference.sh and commit docs/config-reference.md\n";
  return 1;
}
