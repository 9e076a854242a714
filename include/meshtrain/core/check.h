#pragma once
// MT_CHECK: a user error (bad config, bad file, bad rank count) -> meshtrain::Error
// with the message and a hint; MT_ASSERT: a bug in meshtrain itself. Both throw,
// never a process exit: main() turns the exception into one log line and, with several
// ranks, an MPI_Abort so no rank is left waiting in a collective.
#include <sstream>
#include <stdexcept>
#include <string>

namespace meshtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_check(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_assert(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace meshtrain

#define MT_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) ::meshtrain::detail::throw_check(__FILE__, __LINE__,                    \
                                                  ::meshtrain::detail::concat(__VA_ARGS__)); \
  } while (0)

#define MT_FAIL(...) ::meshtrain::detail::throw_check(__FILE__, __LINE__, ::meshtrain::detail::concat(__VA_ARGS__))

#define MT_ASSERT(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond)) ::meshtrain::detail::throw_assert(__FILE__, __LINE__, #cond,                 \
                                                   ::meshtrain::detail::concat("" __VA_OPT__(,) __VA_ARGS__)); \
  } while (0)
