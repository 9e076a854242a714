#pragma once
// The rope kernels' view of a tensor of any layout (rows::Strided), shared by
// the CPU and CUDA launchers.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>

#include "row_math.h"

namespace meshtrain::ops::impl {

inline rows::Strided strided_layout(const at::Tensor& x, const at::Tensor& out, int64_t seq_dim) {
  rows::Strided s{};
  s.dims = static_cast<int>(x.dim());
  s.seq = static_cast<int>(seq_dim);
  s.half = x.size(-1) / 2;
  for (int d = 0; d < s.dims; ++d) {
    s.size[d] = x.size(d);
    s.x_stride[d] = x.stride(d);
    s.out_stride[d] = out.stride(d);
  }
  s.narrow = rows::rope_pairs(s) < rows::kFastDivLimit;
  if (s.narrow)
    for (int d = 0; d < s.dims; ++d) s.div[d] = rows::FastDiv(static_cast<uint32_t>(std::max<int64_t>(s.size[d], 1)));
  return s;
}

}  // namespace meshtrain::ops::impl
