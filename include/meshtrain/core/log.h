#pragma once
// Logging goes through spdlog. setup_logging() is called once by main: rank 0
// logs at info, other ranks only warnings and errors, each line tagged with the
// rank when more than one runs.
#include <spdlog/spdlog.h>

namespace meshtrain {

void setup_logging(int rank, int world_size, bool verbose = false);

}  // namespace meshtrain
