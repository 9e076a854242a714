#include "meshtrain/core/host.h"

#include <unistd.h>

namespace meshtrain {

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace meshtrain
