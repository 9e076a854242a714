#pragma once
// The arithmetic of the fused kernels (ops/fused.h), written once and
// compiled twice: by the C++ compiler for the CPU kernels (cpu_kernels.cpp)
// and by nvcc for the CUDA ones (cuda_kernels.cu). So the CPU tests exercise
// the very indexing and math a GPU runs; only the launch and the Lanes below
// (how a row's threads split columns and combine partial results) differ.
//
// Element types go through Scalar<T>::load/store (fp32 math whatever the
// storage): each side specialises it for its bf16/fp16 types before use.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#if defined(__CUDACC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD inline
#endif

namespace meshtrain::ops::rows {

template <class T>
struct Scalar;

template <>
struct Scalar<float> {
  MT_HD static float load(float v) { return v; }
  MT_HD static float store(float v) { return v; }
};

// Only so dispatch macros that also list double compile: the checks refuse it.
template <>
struct Scalar<double> {
  MT_HD static float load(double v) { return static_cast<float>(v); }
  MT_HD static double store(float v) { return v; }
};

template <class T>
MT_HD float ld(const T& v) {
  return Scalar<T>::load(v);
}
template <class T>
MT_HD T st(float v) {
  return Scalar<T>::store(v);
}

// One thread does a whole row (the CPU kernels).
struct SerialLanes {
  MT_HD int64_t lane() const { return 0; }
  MT_HD int64_t lanes() const { return 1; }
  MT_HD float sum(float v) const { return v; }
  MT_HD float max(float v) const { return v; }
};

// ---- rotary embedding ------------------------------------------------------
// x and out are N-d (N <= kMaxDims) with the features last (stride 1) and
// positions along `seq`. Work item i is one (first half, second half) pair:
//   y1 = x1 cos - x2 sin,  y2 = x2 cos + x1 sin      (forward)
//   y1 = x1 cos + x2 sin,  y2 = x2 cos - x1 sin      (inverse = the backward)
// in place when out aliases x (each pair is read before it is written).
constexpr int kMaxDims = 6;

// n / d for 0 <= n < 2^31 by a divisor fixed per launch: a multiply-high, an
// add and a shift (Granlund & Montgomery's method, as PyTorch's IntDivider).
// The rope kernel splits every work item's index over up to five dims; as
// 64-bit divisions (a ~70-instruction subroutine each on a GPU) that index
// arithmetic, not memory, bounded it (issue 45: RoPE at a quarter of the
// bandwidth).
struct FastDiv {
  uint32_t d = 1, magic = 1, shift = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while (shift < 32 && (uint64_t{1} << shift) < divisor) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor)) / divisor + 1);
  }
  MT_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};
constexpr int64_t kFastDivLimit = int64_t{1} << 31;

struct Strided {
  int64_t size[kMaxDims];
  int64_t x_stride[kMaxDims];
  int64_t out_stride[kMaxDims];
  int dims;      // including the feature dim (last)
  int seq;       // index of the position dim
  int64_t half;  // features / 2
  // Every pair index fits 31 bits (rope_pairs < 2^31): row indices split
  // by div[d] (size[d]) in 32-bit arithmetic. strided_layout sets both.
  bool narrow;
  FastDiv div[kMaxDims];
};

// Pairs in a tensor: every element of the leading dims times half.
MT_HD int64_t rope_pairs(const Strided& s) {
  int64_t n = s.half;
  for (int d = 0; d < s.dims - 1; ++d) n *= s.size[d];
  return n;
}

// Where row r of pairs (one position of one head: `half` pairs) starts in x
// and out, and its position.
struct RopeRow {
  int64_t x, out, pos;
};
MT_HD RopeRow rope_row_start(const Strided& s, int64_t r) {
  RopeRow o{0, 0, 0};
  if (s.narrow) {
    uint32_t n = static_cast<uint32_t>(r);
    for (int d = s.dims - 2; d >= 0; --d) {
      const uint32_t q = s.div[d].div(n);
      const int64_t c = n - q * s.div[d].d;
      n = q;
      o.x += c * s.x_stride[d];
      o.out += c * s.out_stride[d];
      if (d == s.seq) o.pos = c;
    }
    return o;
  }
  for (int d = s.dims - 2; d >= 0; --d) {
    const int64_t c = r % s.size[d];
    r /= s.size[d];
    o.x += c * s.x_stride[d];
    o.out += c * s.out_stride[d];
    if (d == s.seq) o.pos = c;
  }
  return o;
}

// Pair f of a row: cos/sin point at the row's position, sign -1 inverts.
template <class T>
MT_HD void rope_at(const T* x, T* out, const float* cos, const float* sin, float sign, int64_t half, int64_t f) {
  const float c = cos[f], sn = sign * sin[f];
  const float a = ld(x[f]), b = ld(x[f + half]);
  out[f] = st<T>(a * c - b * sn);
  out[f + half] = st<T>(b * c + a * sn);
}

// Pairs [f0, f0 + count) of one row (cut at the row's end), the row's index
// arithmetic (64-bit divisions) once for all of them. The CUDA kernel gives
// each thread kRopePairsPerThread adjacent pairs of a row; the CPU kernel a
// whole row.
template <class T>
MT_HD void rope_pairs_of_row(const Strided& s, int64_t row, int64_t f0, int64_t count, const T* x, T* out,
                             const float* cos, const float* sin, int64_t offset, bool inverse) {
  const RopeRow r = rope_row_start(s, row);
  const int64_t t = (r.pos + offset) * s.half;
  const float sign = inverse ? -1.0f : 1.0f;
  const int64_t end = f0 + count < s.half ? f0 + count : s.half;
  for (int64_t f = f0; f < end; ++f) rope_at(x + r.x, out + r.out, cos + t, sin + t, sign, s.half, f);
}
constexpr int64_t kRopePairsPerThread = 8;

// ---- 16-byte vectors ----------------------------------------------------------
// The kernels move a row's elements kVec<T> at a time (one 128-bit access on
// a GPU instead of kVec two-byte ones) where every such access is 16-byte
// aligned, else one at a time (width 1). A function templated on the width V
// computes each element with the same expression on either path; with one
// thread per row (the CPU kernels) it also visits them in the same order, so
// the widths give the same bits wherever the row's reduction order does not
// depend on V (RoPE, RMSNorm; the softmax statistics rescale once per vector).
template <class T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));

template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

#if defined(__CUDACC__)
#define MT_UNROLL _Pragma("unroll")
#else
#define MT_UNROLL
#endif

// A vector load / store at an address aligned to the vector (to 16 bytes
// for the wide ones): on the device 128-bit accesses, one plain access at
// width 1; on the host through memcpy (no aliasing assumptions).
template <class V, class T>
MT_HD V load_vec(const T* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(V) % 16 == 0) {
    V v;
    for (int k = 0; k < static_cast<int>(sizeof(V) / 16); ++k)
      reinterpret_cast<uint4*>(&v)[k] = reinterpret_cast<const uint4*>(p)[k];
    return v;
  } else {
    return *reinterpret_cast<const V*>(p);
  }
#else
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
#endif
}
template <class V, class T>
MT_HD void store_vec(T* p, const V& v) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(V) % 16 == 0) {
    for (int k = 0; k < static_cast<int>(sizeof(V) / 16); ++k)
      reinterpret_cast<uint4*>(p)[k] = reinterpret_cast<const uint4*>(&v)[k];
  } else {
    *reinterpret_cast<V*>(p) = v;
  }
#else
  std::memcpy(p, &v, sizeof(V));
#endif
}

// Whether rows of `cols` elements of T, starting `ld` elements apart, can be
// moved by kVec<T> vectors: both multiples of the vector and every base
// pointer given (T rows, or the fp32 per-column vectors beside them) 16-byte
// aligned. Null pointers (absent operands) do not count.
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}
// Why rows of elem_bytes-wide elements cannot move by 16-byte vectors; null
// where they can (ops/paths.h reports the reason of a slow path).
inline const char* rows_scalar_reason(int64_t elem_bytes, int64_t cols, int64_t ld,
                                      std::initializer_list<const void*> ptrs) {
  const int64_t v = 16 / elem_bytes;
  if (cols % v != 0) return "row length not a multiple of the 16-byte vector";
  if (ld % v != 0) return "row stride not a multiple of the 16-byte vector";
  if (!aligned16(ptrs)) return "an operand not 16-byte aligned";
  return nullptr;
}
template <class T>
inline bool rows_vectorizable(int64_t cols, int64_t ld, std::initializer_list<const void*> ptrs) {
  return rows_scalar_reason(sizeof(T), cols, ld, ptrs) == nullptr;
}

// Calls run with the width (a std::integral_constant) both backends take for
// the same tensors: kVec<T> where `vectorizable`, else 1.
template <class T, class F>
inline void with_width(bool vectorizable, F&& run) {
  if (vectorizable)
    run(std::integral_constant<int, kVec<T>>{});
  else
    run(std::integral_constant<int, 1>{});
}

// ---- RoPE by 16-byte vectors: kVec<T> pairs of a row at once ---------------
// Each half of the pairs is read and written as one 16-byte vector, and the
// tables as 16-byte vectors too, where rope_vectorizable() says every such
// access is 16-byte aligned. The arithmetic is rope_at's, element for element
// (the same expression, so the same bits), and both kernels take this path
// when they can: the CPU tests check its indexing against the scalar path.
// Whether every row's halves and table rows start 16-byte aligned: the
// feature dim contiguous, half a multiple of the vector, every other stride
// a multiple of it, and the four base pointers aligned.
// rope_scalar_reason: why not (null: it is).
inline const char* rope_scalar_reason(int64_t elem_bytes, const Strided& s, const void* x, const void* out,
                                      const float* cos, const float* sin) {
  const int64_t V = 16 / elem_bytes;
  if (s.dims < 1 || s.x_stride[s.dims - 1] != 1 || s.out_stride[s.dims - 1] != 1)
    return "feature dim not contiguous";
  if (s.half % V != 0) return "half the head dim not a multiple of the 16-byte vector";
  for (int d = 0; d < s.dims - 1; ++d)
    if (s.x_stride[d] % V != 0 || s.out_stride[d] % V != 0) return "a stride not a multiple of the 16-byte vector";
  if (!(x && out && cos && sin && aligned16({x, out, cos, sin}))) return "an operand not 16-byte aligned";
  return nullptr;
}
template <class T>
inline bool rope_vectorizable(const Strided& s, const void* x, const void* out, const float* cos, const float* sin) {
  return rope_scalar_reason(sizeof(T), s, x, out, cos, sin) == nullptr;
}

// Pairs [f0, f0 + kVec<T>) of one row (f0 a multiple of the vector).
template <class T>
MT_HD void rope_vec_of_row(const Strided& s, int64_t row, int64_t f0, const T* x, T* out, const float* cos,
                           const float* sin, int64_t offset, bool inverse) {
  constexpr int V = kVec<T>;
  using TV = Vec<T, V>;
  using FV = Vec<float, V>;
  const RopeRow r = rope_row_start(s, row);
  const int64_t t = (r.pos + offset) * s.half + f0;
  const float sign = inverse ? -1.0f : 1.0f;
  const TV a = load_vec<TV>(x + r.x + f0), b = load_vec<TV>(x + r.x + f0 + s.half);
  const FV c = load_vec<FV>(cos + t), sn = load_vec<FV>(sin + t);
  TV oa, ob;
  MT_UNROLL
  for (int i = 0; i < V; ++i) {
    const float cc = c.v[i], ss = sign * sn.v[i];
    const float av = ld(a.v[i]), bv = ld(b.v[i]);
    oa.v[i] = st<T>(av * cc - bv * ss);
    ob.v[i] = st<T>(bv * cc + av * ss);
  }
  store_vec(out + r.out + f0, oa);
  store_vec(out + r.out + f0 + s.half, ob);
}

// One row per work item (the CPU kernel).
template <class T>
MT_HD void rope_row(const Strided& s, int64_t row, const T* x, T* out, const float* cos, const float* sin,
                    int64_t offset, bool inverse) {
  rope_pairs_of_row(s, row, 0, s.half, x, out, cos, sin, offset, inverse);
}

// ---- RMSNorm with an optional residual add ---------------------------------
// h = a + b (rounded to T: the residual stream stores it), y = h * rstd * w (+ bias),
// rstd = 1 / sqrt(mean(h^2) + eps). Without b, h is a and is not written.
// Returns rstd (the backward's only statistic). V: the width (above); a lane
// visits the vectors lane, lane + lanes, ... of the row, in both passes.
template <int V, class T, class L>
MT_HD float rms_norm_row(const L& l, const T* a, const T* b, const float* w, const float* bias, T* h, T* y,
                         int64_t D, float eps) {
  using TV = Vec<T, V>;
  using FV = Vec<float, V>;
  float ss = 0;
  for (int64_t j = l.lane() * V; j < D; j += l.lanes() * V) {
    TV x = load_vec<TV>(a + j);
    if (b) {
      const TV r = load_vec<TV>(b + j);
      MT_UNROLL
      for (int i = 0; i < V; ++i) x.v[i] = st<T>(ld(x.v[i]) + ld(r.v[i]));
      store_vec(h + j, x);
    }
    MT_UNROLL
    for (int i = 0; i < V; ++i) {
      const float v = ld(x.v[i]);
      ss += v * v;
    }
  }
  ss = l.sum(ss);
  const float rstd = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  const T* src = b ? h : a;  // each thread re-reads only what it wrote
  for (int64_t j = l.lane() * V; j < D; j += l.lanes() * V) {
    const TV x = load_vec<TV>(src + j);
    const FV wv = load_vec<FV>(w + j);
    FV bv{};
    if (bias) bv = load_vec<FV>(bias + j);
    TV out;
    MT_UNROLL
    for (int i = 0; i < V; ++i) {
      float v = ld(x.v[i]) * rstd * wv.v[i];
      if (bias) v += bv.v[i];
      out.v[i] = st<T>(v);
    }
    store_vec(y + j, out);
  }
  return rstd;
}

// dh = rstd * (g - xhat * mean(g * xhat)) (+ dres), g = dy * w, xhat = h * rstd;
// dw += dy * xhat and db += dy per column (accumulators the caller owns for
// the columns this lane visits: the same ones in every row).
template <int V, class T, class L>
MT_HD void rms_norm_backward_row(const L& l, const T* dy, const T* h, const float* w, float rstd, const T* dres,
                                 T* dh, float* dw, float* db, int64_t D) {
  using TV = Vec<T, V>;
  using FV = Vec<float, V>;
  float dot = 0;
  for (int64_t j = l.lane() * V; j < D; j += l.lanes() * V) {
    const TV g = load_vec<TV>(dy + j), x = load_vec<TV>(h + j);
    const FV wv = load_vec<FV>(w + j);
    MT_UNROLL
    for (int i = 0; i < V; ++i) dot += ld(g.v[i]) * wv.v[i] * ld(x.v[i]) * rstd;
  }
  dot = l.sum(dot) / static_cast<float>(D);
  for (int64_t j = l.lane() * V; j < D; j += l.lanes() * V) {
    const TV g = load_vec<TV>(dy + j), x = load_vec<TV>(h + j);
    const FV wv = load_vec<FV>(w + j);
    TV r;
    if (dres) r = load_vec<TV>(dres + j);
    TV out;
    MT_UNROLL
    for (int i = 0; i < V; ++i) {
      const float gi = ld(g.v[i]), xhat = ld(x.v[i]) * rstd;
      float v = rstd * (gi * wv.v[i] - xhat * dot);
      if (dres) v += ld(r.v[i]);
      out.v[i] = st<T>(v);
      dw[j + i] += gi * xhat;
      if (db) db[j + i] += gi;
    }
    store_vec(dh + j, out);
  }
}

// ---- cross-entropy over one row of logits ----------------------------------
// Online max and sum of exp over the valid columns [0, valid): one read. The
// running sum is rescaled once per vector (to the larger of its max and the
// vector's), then takes the vector's exps: at width 1 the classic online
// softmax. A vector may reach past `valid` (not past the row): those
// columns are left out.
struct SoftmaxStats {
  float max, sum;  // sum of exp(z - max)
};

template <int V, class T, class L>
MT_HD SoftmaxStats softmax_stats_row(const L& l, const T* z, int64_t valid) {
  using TV = Vec<T, V>;
  float m = -INFINITY, s = 0;
  for (int64_t j = l.lane() * V; j < valid; j += l.lanes() * V) {
    const TV x = load_vec<TV>(z + j);
    float xm = -INFINITY;
    MT_UNROLL
    for (int i = 0; i < V; ++i)
      if (j + i < valid) xm = fmaxf(xm, ld(x.v[i]));
    if (xm > m) {
      s *= expf(m - xm);
      m = xm;
    }
    MT_UNROLL
    for (int i = 0; i < V; ++i)
      if (j + i < valid) s += expf(ld(x.v[i]) - m);
  }
  const float M = l.max(m);
  s = m == -INFINITY ? 0.0f : s * expf(m - M);
  return {M, l.sum(s)};
}

// z becomes d loss / d z for the loss lse - z[target]: softmax - onehot, and
// 0 in the padding columns [valid, cols). target outside [0, valid) means the
// target lives in another vocabulary shard (no one-hot here).
template <int V, class T, class L>
MT_HD void softmax_grad_row(const L& l, T* z, int64_t valid, int64_t cols, int64_t target, float lse) {
  using TV = Vec<T, V>;
  for (int64_t j = l.lane() * V; j < cols; j += l.lanes() * V) {
    TV x = load_vec<TV>(z + j);
    MT_UNROLL
    for (int i = 0; i < V; ++i) {
      const int64_t c = j + i;
      float p = c < valid ? expf(ld(x.v[i]) - lse) : 0.0f;
      if (c == target && c < valid) p -= 1.0f;
      x.v[i] = st<T>(p);
    }
    store_vec(z + j, x);
  }
}

// The fused single-shard version: the loss, and z overwritten by its gradient.
// z[target] is read before any thread writes (the reductions in between
// synchronise a block).
template <int V, class T, class L>
MT_HD float cross_entropy_row(const L& l, T* z, int64_t cols, int64_t target, bool grad) {
  const bool in = target >= 0 && target < cols;
  const float picked = in ? ld(z[target]) : 0.0f;
  const SoftmaxStats s = softmax_stats_row<V>(l, z, cols);
  const float lse = s.max + logf(s.sum);
  if (grad) softmax_grad_row<V>(l, z, cols, cols, target, lse);
  return lse - picked;
}

}  // namespace meshtrain::ops::rows
