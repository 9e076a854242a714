#pragma once
// The row math of the MoE slot operators (ops/slot_rows.h), written once for
// the CPU kernels (cpu_kernels.cpp) and the CUDA ones (cuda_kernels.cu), as
// row_math.h's. A buffer row is d contiguous elements; math is fp32.
#include "row_math.h"

namespace meshtrain::ops::rows {

// Token row out = sum over its k assignments j of weight[j] * src[slot[j]]
// (slot < 0: the assignment has no row and adds nothing; weight null: 1),
// summed in fp32 in j order and rounded once.
template <int V, class L, class T>
MT_HD void combine_row(const L& l, const T* src, const int64_t* slot, const float* weight, int64_t k, T* out,
                       int64_t d) {
  using TV = Vec<T, V>;
  for (int64_t c = l.lane() * V; c < d; c += l.lanes() * V) {
    float acc[V];
    MT_UNROLL for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = slot[j];
      if (s < 0) continue;
      const float w = weight ? weight[j] : 1.0f;
      const TV v = load_vec<TV>(src + s * d + c);
      MT_UNROLL for (int i = 0; i < V; ++i) acc[i] += w * ld(v.v[i]);
    }
    TV o;
    MT_UNROLL for (int i = 0; i < V; ++i) o.v[i] = st<T>(acc[i]);
    store_vec(out + c, o);
  }
}

// Buffer row out = weight[a] * src[a / k] for the assignment a = owner that
// holds the row (weight null: 1), zeros for a row none holds (owner < 0).
// With y_row (the row's forward value, when src is the combine's output
// gradient) it also returns d(loss)/d(weight[a]) = dot(src[a / k], y_row) in
// fp32, summed over the lanes (0 for a row none holds).
template <int V, class L, class T>
MT_HD float spread_row(const L& l, const T* src, int64_t owner, int64_t k, const float* weight, const T* y_row, T* out,
                       int64_t d) {
  using TV = Vec<T, V>;
  const T* s = owner >= 0 ? src + (owner / k) * d : nullptr;
  const float w = s && weight ? weight[owner] : 1.0f;
  float dot = 0.0f;
  for (int64_t c = l.lane() * V; c < d; c += l.lanes() * V) {
    TV o;
    if (s) {
      const TV v = load_vec<TV>(s + c);
      MT_UNROLL for (int i = 0; i < V; ++i) o.v[i] = st<T>(w * ld(v.v[i]));
      if (y_row) {
        const TV y = load_vec<TV>(y_row + c);
        MT_UNROLL for (int i = 0; i < V; ++i) dot += ld(v.v[i]) * ld(y.v[i]);
      }
    } else {
      MT_UNROLL for (int i = 0; i < V; ++i) o.v[i] = st<T>(0.0f);
    }
    store_vec(out + c, o);
  }
  // Uniform over a row's lanes (one owner per row), so every lane sums.
  return s && y_row ? l.sum(dot) : 0.0f;
}

}  // namespace meshtrain::ops::rows
