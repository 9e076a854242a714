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

struct Strided {
  int64_t size[kMaxDims];
  int64_t x_stride[kMaxDims];
  int64_t out_stride[kMaxDims];
  int dims;      // including the feature dim (last)
  int seq;       // index of the position dim
  int64_t half;  // features / 2
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

// ---- RoPE by 16-byte vectors: kRopeVec<T> pairs of a row at once ----------
// Each half of the pairs is read and written as one 16-byte vector, and the
// tables as 16-byte vectors too, where rope_vectorizable() says every such
// access is 16-byte aligned. The arithmetic is rope_at's, element for element
// (the same expression, so the same bits), and both kernels take this path
// when they can: the CPU tests check its indexing against the scalar path.
template <class T>
constexpr int kRopeVec = static_cast<int>(16 / sizeof(T));

template <class T, int N>
struct alignas(16) Vec {
  T v[N];
};

// A 16-byte-aligned load / store (on the host through memcpy: no aliasing
// assumptions; on the device one 128-bit access).
template <class V, class T>
MT_HD V load_vec(const T* p) {
#if defined(__CUDA_ARCH__)
  static_assert(sizeof(V) % 16 == 0, "16-byte vectors");
  V v;
  for (int k = 0; k < static_cast<int>(sizeof(V) / 16); ++k)
    reinterpret_cast<uint4*>(&v)[k] = reinterpret_cast<const uint4*>(p)[k];
  return v;
#else
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
#endif
}
template <class V, class T>
MT_HD void store_vec(T* p, const V& v) {
#if defined(__CUDA_ARCH__)
  for (int k = 0; k < static_cast<int>(sizeof(V) / 16); ++k)
    reinterpret_cast<uint4*>(p)[k] = reinterpret_cast<const uint4*>(&v)[k];
#else
  std::memcpy(p, &v, sizeof(V));
#endif
}

// Whether every row's halves and table rows start 16-byte aligned: the
// feature dim contiguous, half a multiple of the vector, every other stride
// a multiple of it, and the four base pointers aligned.
template <class T>
inline bool rope_vectorizable(const Strided& s, const void* x, const void* out, const float* cos, const float* sin) {
  constexpr int V = kRopeVec<T>;
  if (s.dims < 1 || s.x_stride[s.dims - 1] != 1 || s.out_stride[s.dims - 1] != 1 || s.half % V != 0) return false;
  for (int d = 0; d < s.dims - 1; ++d)
    if (s.x_stride[d] % V != 0 || s.out_stride[d] % V != 0) return false;
  for (const void* p : {x, out, static_cast<const void*>(cos), static_cast<const void*>(sin)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Pairs [f0, f0 + kRopeVec<T>) of one row (f0 a multiple of the vector).
template <class T>
MT_HD void rope_vec_of_row(const Strided& s, int64_t row, int64_t f0, const T* x, T* out, const float* cos,
                           const float* sin, int64_t offset, bool inverse) {
  constexpr int V = kRopeVec<T>;
  using TV = Vec<T, V>;
  using FV = Vec<float, V>;
  const RopeRow r = rope_row_start(s, row);
  const int64_t t = (r.pos + offset) * s.half + f0;
  const float sign = inverse ? -1.0f : 1.0f;
  const TV a = load_vec<TV>(x + r.x + f0), b = load_vec<TV>(x + r.x + f0 + s.half);
  const FV c = load_vec<FV>(cos + t), sn = load_vec<FV>(sin + t);
  TV oa, ob;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
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
// Returns rstd (the backward's only statistic).
template <class T, class L>
MT_HD float rms_norm_row(const L& l, const T* a, const T* b, const float* w, const float* bias, T* h, T* y,
                         int64_t D, float eps) {
  float ss = 0;
  for (int64_t i = l.lane(); i < D; i += l.lanes()) {
    float v = ld(a[i]);
    if (b) {
      const T r = st<T>(v + ld(b[i]));
      h[i] = r;
      v = ld(r);
    }
    ss += v * v;
  }
  ss = l.sum(ss);
  const float rstd = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  const T* src = b ? h : a;  // each thread re-reads only what it wrote
  for (int64_t i = l.lane(); i < D; i += l.lanes()) {
    float v = ld(src[i]) * rstd * w[i];
    if (bias) v += bias[i];
    y[i] = st<T>(v);
  }
  return rstd;
}

// dh = rstd * (g - xhat * mean(g * xhat)) (+ dres), g = dy * w, xhat = h * rstd;
// dw += dy * xhat and db += dy per column (accumulators the caller owns for
// the columns this thread visits).
template <class T, class L>
MT_HD void rms_norm_backward_row(const L& l, const T* dy, const T* h, const float* w, float rstd, const T* dres,
                                 T* dh, float* dw, float* db, int64_t D) {
  float dot = 0;
  for (int64_t i = l.lane(); i < D; i += l.lanes()) dot += ld(dy[i]) * w[i] * ld(h[i]) * rstd;
  dot = l.sum(dot) / static_cast<float>(D);
  for (int64_t i = l.lane(); i < D; i += l.lanes()) {
    const float g = ld(dy[i]), xhat = ld(h[i]) * rstd;
    float v = rstd * (g * w[i] - xhat * dot);
    if (dres) v += ld(dres[i]);
    dh[i] = st<T>(v);
    dw[i] += g * xhat;
    if (db) db[i] += g;
  }
}

// ---- cross-entropy over one row of logits ----------------------------------
// Online max and sum of exp over the valid columns [0, valid): one read.
struct SoftmaxStats {
  float max, sum;  // sum of exp(z - max)
};

template <class T, class L>
MT_HD SoftmaxStats softmax_stats_row(const L& l, const T* z, int64_t valid) {
  float m = -INFINITY, s = 0;
  for (int64_t i = l.lane(); i < valid; i += l.lanes()) {
    const float v = ld(z[i]);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  const float M = l.max(m);
  s = m == -INFINITY ? 0.0f : s * expf(m - M);
  return {M, l.sum(s)};
}

// z becomes d loss / d z for the loss lse - z[target]: softmax - onehot, and
// 0 in the padding columns [valid, V). target outside [0, valid) means the
// target lives in another vocabulary shard (no one-hot here).
template <class T, class L>
MT_HD void softmax_grad_row(const L& l, T* z, int64_t valid, int64_t V, int64_t target, float lse) {
  for (int64_t i = l.lane(); i < V; i += l.lanes()) {
    float p = i < valid ? expf(ld(z[i]) - lse) : 0.0f;
    if (i == target && i < valid) p -= 1.0f;
    z[i] = st<T>(p);
  }
}

// The fused single-shard version: the loss, and z overwritten by its gradient.
// z[target] is read before any thread writes (the reductions in between
// synchronise a block).
template <class T, class L>
MT_HD float cross_entropy_row(const L& l, T* z, int64_t V, int64_t target, bool grad) {
  const bool in = target >= 0 && target < V;
  const float picked = in ? ld(z[target]) : 0.0f;
  const SoftmaxStats s = softmax_stats_row(l, z, V);
  const float lse = s.max + logf(s.sum);
  if (grad) softmax_grad_row(l, z, V, V, target, lse);
  return lse - picked;
}

}  // namespace meshtrain::ops::rows
