#include "meshtrain/core/check.h"

namespace meshtrain::detail {

namespace {
const char* basename(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p)
    if (*p == '/') base = p + 1;
  return base;
}
// what() is a C string: a NUL inside a message (from a file name or a value
// the user wrote) would cut it there. Show it as \0 instead.
std::string printable(const std::string& msg) {
  if (msg.find('\0') == std::string::npos) return msg;
  std::string out;
  for (char c : msg) {
    if (c == '\0') out += "\\0";
    else out += c;
  }
  return out;
}
}  // namespace

void throw_check(const char* file, int line, const std::string& msg) {
  // The message is what a user reads; the location helps us when they report it.
  throw Error(printable(msg) + " [" + basename(file) + ":" + std::to_string(line) + "]");
}

void throw_assert(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(std::string("internal error (a meshtrain bug): ") + cond + " failed" +
              (msg.empty() ? "" : ": " + printable(msg)) + " [" + basename(file) + ":" + std::to_string(line) + "]");
}

}  // namespace meshtrain::detail
