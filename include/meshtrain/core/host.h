#pragma once
// Facts about the machine this process runs on.
#include <string>

namespace meshtrain {

// This host's name (gethostname); "localhost" when it has none.
std::string hostname();

}  // namespace meshtrain
