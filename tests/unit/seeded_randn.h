#pragma once
// Reproducible test inputs: standard normal values from a CPU generator of
// their own seed, drawn in fp32 and then cast (so a bf16 input is the
// rounding of the fp32 one with the same seed).
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace meshtrain::test_util {

inline at::Tensor randn(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dt = at::kFloat) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)).to(dt);
}

}  // namespace meshtrain::test_util
