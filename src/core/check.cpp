#include "meshtrain/core/check.h"

namespace meshtrain::detail {

namespace {
const char* basename(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p)
    if (*p == '/') base = p + 1;
  return base;
}
}  // namespace

void throw_check(const char* file, int line, const std::string& msg) {
  // The message is what a user reads; the location helps us when they report it.
  throw Error(msg + " [" + basename(file) + ":" + std::to_string(line) + "]");
}

void throw_assert(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(std::string("internal error (a meshtrain bug): ") + cond + " failed" +
              (msg.empty() ? "" : ": " + msg) + " [" + basename(file) + ":" + std::to_string(line) + "]");
}

}  // namespace meshtrain::detail
