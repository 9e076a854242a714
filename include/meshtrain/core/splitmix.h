#pragma once
// splitmix64's finaliser: a cheap bijective mix, so nearby inputs (a seed and
// a name hash, a seed and a tp rank) give unrelated 64-bit seeds.
#include <cstdint>

namespace meshtrain {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace meshtrain
