#pragma once
// Launch arithmetic of the CUDA kernels that depends on device limits, as
// plain host functions (no CUDA header): cuda_kernels.cu asks the device for
// the limits and calls these; tests/unit/ops_test.cpp checks them on the CPU.
#include <cstdint>

namespace meshtrain::ops::launch {

// Where a block of the RMSNorm backward keeps its column sums ([D] floats
// for the weight, [D] more with a bias). A block may take
// `default_limit` bytes of shared memory (48 KiB on every GPU since Volta)
// without asking, up to `opt_in_limit` (227 KiB on Hopper) after
// cudaFuncSetAttribute(MaxDynamicSharedMemorySize), and the kernel's own
// static shared memory counts against both: leaving it out made the launch
// fail at D 12288 without a bias (6144 with), where the sums alone are
// exactly 48 KiB. Sums that fit nowhere stay in the block's row of global
// partial sums.
struct NormBwdSums {
  bool in_shared = false;     // the sums in shared memory
  int64_t dynamic_bytes = 0;  // the launch's dynamic shared memory
  bool opt_in = false;        // needs the attribute set first (more than default_limit in all)
};

inline NormBwdSums norm_bwd_sums(int64_t D, bool bias, int64_t static_bytes, int64_t default_limit,
                                 int64_t opt_in_limit) {
  const int64_t sums = D * static_cast<int64_t>(sizeof(float)) * (bias ? 2 : 1);
  NormBwdSums p;
  if (static_bytes + sums <= default_limit) {
    p.in_shared = true;
  } else if (static_bytes + sums <= opt_in_limit) {
    p.in_shared = true;
    p.opt_in = true;
  } else {
    return p;
  }
  p.dynamic_bytes = sums;
  return p;
}

}  // namespace meshtrain::ops::launch
