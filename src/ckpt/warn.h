#pragma once
// Warnings from ckpt/ (skipped checkpoints, leftovers that could not be
// removed). One funnel so that only warn.cpp has to include spdlog; see there.
#include <string>

namespace meshtrain::ckpt_log {

void warn(const std::string& message);

}  // namespace meshtrain::ckpt_log
