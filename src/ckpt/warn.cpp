#include "warn.h"

// libtorch ships its own fmt (12.x) in its include dir, which shadows the
// system fmt (9.x) that Debian's spdlog is built against, so <spdlog/spdlog.h>
// does not compile in a translation unit that sees torch's include path.
// Pulling the system fmt in first (same include guards) makes spdlog use it.
// TODO(build): drop this once the CMake include order puts the system fmt first.
#include "/usr/include/fmt/core.h"
#include "/usr/include/fmt/format.h"
#include <spdlog/spdlog.h>

namespace meshtrain::ckpt_log {

void warn(const std::string& message) { spdlog::warn("{}", message); }

}  // namespace meshtrain::ckpt_log
