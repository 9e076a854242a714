#pragma once
// File-system helpers shared by the checkpointer and the run directory.
#include <string>

namespace meshtrain {

// Removes path (recursively) and never throws: a failed deletion costs only
// disk space, so it is logged as a warning with `why` instead of failing work
// that is already complete.
void remove_quietly(const std::string& path, const std::string& why);

}  // namespace meshtrain
