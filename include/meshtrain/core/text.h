#pragma once
// Small text helpers shared by error messages and listings.
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

// "[512, 64]": a tensor shape as messages and `checkpoint inspect` print it.
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace meshtrain
