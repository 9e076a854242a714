#include "meshtrain/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace meshtrain {

void setup_logging(int rank, int world_size, bool verbose) {
  auto logger = spdlog::stderr_color_mt("meshtrain");
  if (world_size > 1)
    logger->set_pattern("[%H:%M:%S] [rank " + std::to_string(rank) + "] %^%l%$: %v");
  else
    logger->set_pattern("[%H:%M:%S] %^%l%$: %v");
  if (rank == 0)
    logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  else
    logger->set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace meshtrain
