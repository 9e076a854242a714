// CUDA kernels of the meshtrain operators (see cuda_kernels.h): the row math
// of row_math.h with a warp per row (the RMSNorm forward of rows up to
// 2048), a thread block per row (longer rows, the RMSNorm backward,
// cross-entropy) or a thread per few rotated pairs (rope). Only BlockLanes -- how a block's threads
// split a row and combine partial sums -- and the launches are CUDA's own.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_kernels.h"
#include "launch_plan.h"

namespace meshtrain::ops::rows {

template <>
struct Scalar<__nv_bfloat16> {
  MT_HD static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  MT_HD static __nv_bfloat16 store(float v) { return __float2bfloat16(v); }
};
template <>
struct Scalar<__half> {
  MT_HD static float load(__half v) { return __half2float(v); }
  MT_HD static __half store(float v) { return __float2half(v); }
};

}  // namespace meshtrain::ops::rows

namespace meshtrain::ops::cuda {

namespace {

constexpr int kWarp = 32;
// Launch sizes, shared by the launches and the kernels' __launch_bounds__: a
// row kernel runs at most kMaxRowThreads threads a block (row_threads), rope
// exactly kRopeThreads. The bound lets nvcc budget registers for that block
// size (without it, it may use more than 64 per thread, and a 1024-thread
// launch then fails with "too many resources requested").
constexpr int kMaxRowThreads = 1024;
constexpr int kRopeThreads = 256;
// Rows up to this many elements get a warp each in the RMSNorm forward
// (d_model <= 2048): measured on an H100 at GPT-2's 768, half the time of a
// block per row. The backward keeps a block per row: a warp per row was
// slower there (1.4x), its per-warp partial column sums in global memory.
constexpr int64_t kWarpRowMax = 2048;
constexpr int kWarpRowThreads = 256;
// BlockLanes' reduction keeps one partial per warp in kWarp floats.
static_assert(kMaxRowThreads / kWarp <= kWarp, "a block's warps must fit one scratch slot each");

// Over the 32 lanes of a warp (on the host, where the row templates compile
// too, there is one lane).
__host__ __device__ __forceinline__ float warp_sum(float v) {
#ifdef __CUDA_ARCH__
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
#endif
  return v;
}

__host__ __device__ __forceinline__ float warp_max(float v) {
#ifdef __CUDA_ARCH__
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
#endif
  return v;
}

// A row split over the threads of a block (blockDim.x a multiple of 32, at
// most 1024). Every thread must reach each sum/max: they synchronise the block.
// Host versions exist only so the host-device row templates compile.
struct BlockLanes {
  float* scratch;  // shared, kWarp floats

  __host__ __device__ int64_t lane() const {
#ifdef __CUDA_ARCH__
    return threadIdx.x;
#else
    return 0;
#endif
  }
  __host__ __device__ int64_t lanes() const {
#ifdef __CUDA_ARCH__
    return blockDim.x;
#else
    return 1;
#endif
  }
  __host__ __device__ float sum(float v) const {
#ifdef __CUDA_ARCH__
    v = warp_sum(v);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    __syncthreads();  // the previous reduction's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x / kWarp) ? scratch[lane] : 0.0f;
    return warp_sum(v);
#else
    return v;
#endif
  }
  __host__ __device__ float max(float v) const {
#ifdef __CUDA_ARCH__
    v = warp_max(v);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x / kWarp) ? scratch[lane] : -INFINITY;
    return warp_max(v);
#else
    return v;
#endif
  }
};

// Threads per row block: enough to cover a row a few elements per thread.
int row_threads(int64_t D) {
  if (D >= 4096) return kMaxRowThreads;
  if (D >= 1024) return 512;
  if (D >= 256) return 256;
  return 128;
}

// Row blocks: one per row up to a grid that fills the GPU several times over.
int row_blocks(int64_t N) { return static_cast<int>(std::min<int64_t>(std::max<int64_t>(N, 1), 65535)); }

// Work item i: chunk c = i % chunks of row i / chunks. Pair by pair: pairs
// [c * kRopePairsPerThread, (c + 1) * kRopePairsPerThread), the last chunk of
// a row cut short (measured on an H100, GPT-2's q and k, bf16: ~0.21 ms a
// call, about 3x the time its bytes need: 16 two-byte accesses per 8 pairs,
// not the row's index arithmetic, limit it). kVec: the 16-byte vector c of
// the row (both halves of kVec<T> pairs: two 128-bit loads and stores of
// x, 128-bit loads of the tables), where rows::rope_vectorizable says every
// access is aligned.
// Index arithmetic in 32 bits where s.narrow (every launch of a training
// step): the work item's split by chunks and the row's over its dims are
// FastDiv multiplies, not 64-bit divisions.
template <class T, bool kVec>
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(rows::Strided s, const T* x, T* out, const float* cos,
                                                            const float* sin, int64_t offset, bool inverse,
                                                            rows::FastDiv chunk_div, int64_t n) {
  const int64_t chunks = chunk_div.d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t row, c;
    if (s.narrow) {
      const uint32_t q = chunk_div.div(static_cast<uint32_t>(i));
      row = q;
      c = i - static_cast<int64_t>(q) * chunks;
    } else {
      row = i / chunks;
      c = i % chunks;
    }
    if constexpr (kVec)
      rows::rope_vec_of_row(s, row, c * rows::kVec<T>, x, out, cos, sin, offset, inverse);
    else
      rows::rope_pairs_of_row(s, row, c * rows::kRopePairsPerThread, rows::kRopePairsPerThread, x, out, cos, sin,
                              offset, inverse);
  }
}

// A row per warp (rows of at most kWarpRowMax elements): the reductions are
// warp shuffles, no block barrier; kWarpRowThreads / kWarp rows per block.
struct WarpLanes {
  __host__ __device__ int64_t lane() const {
#ifdef __CUDA_ARCH__
    return threadIdx.x % kWarp;
#else
    return 0;
#endif
  }
  __host__ __device__ int64_t lanes() const { return kWarp; }
  __host__ __device__ float sum(float v) const { return warp_sum(v); }
};

__device__ __forceinline__ int64_t warp_id() {
  return blockIdx.x * static_cast<int64_t>(kWarpRowThreads / kWarp) + threadIdx.x / kWarp;
}

int warp_row_blocks(int64_t rows) {
  const int64_t per_block = kWarpRowThreads / kWarp;
  return static_cast<int>(std::clamp<int64_t>((rows + per_block - 1) / per_block, 1, 65535));
}

template <class T, int V>
__global__ void __launch_bounds__(kWarpRowThreads)
    rms_norm_fwd_warp_kernel(const T* a, const T* b, const float* w, const float* bias, T* h, T* y, float* rstd,
                             int64_t N, int64_t D, float eps) {
  const WarpLanes l;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kWarpRowThreads / kWarp);
  for (int64_t r = warp_id(); r < N; r += warps) {
    const float v = rows::rms_norm_row<V>(l, a + r * D, b ? b + r * D : nullptr, w, bias, h ? h + r * D : nullptr,
                                          y + r * D, D, eps);
    if (threadIdx.x % kWarp == 0) rstd[r] = v;
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kMaxRowThreads)
    rms_norm_fwd_kernel(const T* a, const T* b, const float* w, const float* bias, T* h, T* y, float* rstd, int64_t N,
                        int64_t D, float eps) {
  __shared__ float scratch[kWarp];
  const BlockLanes l{scratch};
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float v = rows::rms_norm_row<V>(l, a + r * D, b ? b + r * D : nullptr, w, bias, h ? h + r * D : nullptr,
                                          y + r * D, D, eps);
    if (threadIdx.x == 0) rstd[r] = v;
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kWarpRowThreads)
    combine_rows_kernel(const T* src, const int64_t* slot, const float* weight, int64_t k, T* out, int64_t N,
                        int64_t d) {
  const WarpLanes l;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kWarpRowThreads / kWarp);
  for (int64_t n = warp_id(); n < N; n += warps)
    rows::combine_row<V>(l, src, slot + n * k, weight ? weight + n * k : nullptr, k, out + n * d, d);
}

template <class T, int V>
__global__ void __launch_bounds__(kWarpRowThreads)
    spread_rows_kernel(const T* src, const int64_t* owner, int64_t k, const float* weight, const T* y, T* out,
                       float* dweight, int64_t R, int64_t d) {
  const WarpLanes l;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kWarpRowThreads / kWarp);
  for (int64_t r = warp_id(); r < R; r += warps) {
    const int64_t a = owner[r];
    const float g = rows::spread_row<V>(l, src, a, k, weight, y ? y + r * d : nullptr, out + r * d, d);
    if (dweight && a >= 0 && threadIdx.x % kWarp == 0) dweight[a] = g;
  }
}

// The column sums of a block's rows: in shared memory when they fit
// (sums_in_shared), else straight in the block's row of dw_part / db_part.
// A thread visits the same columns in every row and owns their sums, so
// neither the zeroing nor the copy out needs a barrier.
template <class T, int V>
__global__ void __launch_bounds__(kMaxRowThreads)
    rms_norm_bwd_kernel(const T* dy, const T* h, const float* w, const float* rstd, const T* dres, T* dh,
                        float* dw_part, float* db_part, int64_t N, int64_t D, bool sums_in_shared) {
  __shared__ float scratch[kWarp];
  extern __shared__ float sums[];  // [D] dw, then [D] db
  const BlockLanes l{scratch};
  float* dw_out = dw_part + blockIdx.x * D;
  float* db_out = db_part ? db_part + blockIdx.x * D : nullptr;
  float* dw = sums_in_shared ? sums : dw_out;
  float* db = db_out && sums_in_shared ? sums + D : db_out;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * V, step = static_cast<int64_t>(blockDim.x) * V;
  if (sums_in_shared)
    for (int64_t c = first; c < D; c += step)
      for (int i = 0; i < V; ++i) {
        dw[c + i] = 0.0f;
        if (db) db[c + i] = 0.0f;
      }
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x)
    rows::rms_norm_backward_row<V>(l, dy + r * D, h + r * D, w, rstd[r], dres ? dres + r * D : nullptr, dh + r * D,
                                   dw, db, D);
  if (sums_in_shared)
    for (int64_t c = first; c < D; c += step)
      for (int i = 0; i < V; ++i) {
        dw_out[c + i] = dw[c + i];
        if (db) db_out[c + i] = db[c + i];
      }
}

template <class T, int V>
__global__ void __launch_bounds__(kMaxRowThreads)
    cross_entropy_kernel(T* z, int64_t ld, int64_t N, int64_t cols, const int64_t* targets, float* loss, bool grad) {
  __shared__ float scratch[kWarp];
  const BlockLanes l{scratch};
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float v = rows::cross_entropy_row<V>(l, z + r * ld, cols, targets[r], grad);
    if (threadIdx.x == 0) loss[r] = v;
    __syncthreads();  // the next row's first reduction reuses scratch
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_stats_kernel(const T* z, int64_t ld, int64_t N, int64_t valid, const int64_t* targets, float* out) {
  __shared__ float scratch[kWarp];
  const BlockLanes l{scratch};
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const rows::SoftmaxStats s = rows::softmax_stats_row<V>(l, z + r * ld, valid);
    if (threadIdx.x == 0) {
      const int64_t t = targets[r];
      out[r] = s.max;
      out[N + r] = s.sum;
      out[2 * N + r] = t >= 0 && t < valid ? rows::ld(z[r * ld + t]) : 0.0f;
    }
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_grad_kernel(T* z, int64_t ld, int64_t N, int64_t valid, int64_t cols, const int64_t* targets,
                        const float* lse) {
  const BlockLanes l{nullptr};  // no reduction: only the column split
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x)
    rows::softmax_grad_row<V>(l, z + r * ld, valid, cols, targets[r], lse[r]);
}

// ---- AdamW: multi-tensor launches planned by adamw::plan_launches ------------
constexpr int kAdamwThreads = 512;

struct AdamwTable {
  float* p[adamw::kTensors];
  const float* g[adamw::kTensors];
  void* m[adamw::kTensors];
  void* v[adamw::kTensors];
  __nv_bfloat16* c[adamw::kTensors];  // the weights' bf16 casts, or null
  int64_t n[adamw::kTensors];
  unsigned char tensor_of[adamw::kBlocks];
  int chunk_of[adamw::kBlocks];
};
static_assert(sizeof(AdamwTable) <= 4000, "a kernel's arguments must stay under 4 KiB");

template <class M>
__global__ void __launch_bounds__(kAdamwThreads)
    adamw_kernel(AdamwTable t, adamw::Hyper h, const float* step, const float* grad_scale, const float* found_inf,
                 const float* lr) {
  if (found_inf && *found_inf != 0.0f) return;
  if (lr) h.lr = *lr;
  const adamw::StepConsts c = adamw::step_consts(h, *step);
  const int k = t.tensor_of[blockIdx.x];
  const int64_t lo = static_cast<int64_t>(t.chunk_of[blockIdx.x]) * adamw::kChunk;
  const int64_t hi = lo + adamw::kChunk < t.n[k] ? lo + adamw::kChunk : t.n[k];
  float* p = t.p[k];
  const float* g = t.g[k];
  M* m = static_cast<M*>(t.m[k]);
  M* v = static_cast<M*>(t.v[k]);
  __nv_bfloat16* cast = t.c[k];
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
    adamw::element(p[i], g[i], m[i], v[i], c, grad_scale, cast ? cast + i : nullptr);
}

// Calls f with the element type of dt.
template <class F>
cudaError_t by_dtype(Dtype dt, F&& f) {
  switch (dt) {
    case Dtype::F32:
      f(float{});
      break;
    case Dtype::BF16:
      f(__nv_bfloat16{});
      break;
    case Dtype::F16:
      f(__half{});
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t rope(Dtype dt, const rows::Strided& s, const void* x, void* out, const float* cos, const float* sin,
                 int64_t offset, bool inverse, cudaStream_t stream) {
  const int64_t pairs = rows::rope_pairs(s);
  if (pairs == 0) return cudaSuccess;
  return by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows::rope_vectorizable<T>(s, x, out, cos, sin);
    const int64_t per_chunk = vec ? rows::kVec<T> : rows::kRopePairsPerThread;
    const int64_t chunks = (s.half + per_chunk - 1) / per_chunk, n = pairs / s.half * chunks;
    const int blocks = static_cast<int>(std::min<int64_t>((n + kRopeThreads - 1) / kRopeThreads, 65535 * 8));
    const auto launch = [&](auto kernel) {
      kernel<<<blocks, kRopeThreads, 0, stream>>>(s, static_cast<const T*>(x), static_cast<T*>(out), cos, sin, offset,
                                                 inverse, rows::FastDiv(static_cast<uint32_t>(chunks)), n);
    };
    if (vec)
      launch(rope_kernel<T, true>);
    else
      launch(rope_kernel<T, false>);
  });
}

cudaError_t rms_norm_fwd(Dtype dt, const void* a, const void* b, const float* w, const float* bias, void* h, void* y,
                         float* rstd, int64_t N, int64_t D, float eps, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    rows::with_width<T>(rows::rows_vectorizable<T>(D, D, {a, b, h, y, w, bias}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      if (D <= kWarpRowMax) {
        rms_norm_fwd_warp_kernel<T, V><<<warp_row_blocks(N), kWarpRowThreads, 0, stream>>>(
            static_cast<const T*>(a), static_cast<const T*>(b), w, bias, static_cast<T*>(h), static_cast<T*>(y), rstd,
            N, D, eps);
        return;
      }
      rms_norm_fwd_kernel<T, V><<<row_blocks(N), row_threads(D / V), 0, stream>>>(
          static_cast<const T*>(a), static_cast<const T*>(b), w, bias, static_cast<T*>(h), static_cast<T*>(y), rstd,
          N, D, eps);
    });
  });
}

cudaError_t rms_norm_bwd(Dtype dt, const void* dy, const void* h, const float* w, const float* rstd, const void* dres,
                         void* dh, float* dw_part, float* db_part, int64_t N, int64_t D, int blocks,
                         cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  int device = 0, opt_in_limit = 0, default_limit = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&default_limit, cudaDevAttrMaxSharedMemoryPerBlock, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&opt_in_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  return by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    rows::with_width<T>(rows::rows_vectorizable<T>(D, D, {dy, h, dres, dh, w}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      const auto kernel = rms_norm_bwd_kernel<T, V>;
      cudaFuncAttributes attr{};
      if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) return;  // by_dtype returns the error
      const launch::NormBwdSums plan =
          launch::norm_bwd_sums(D, db_part != nullptr, static_cast<int64_t>(attr.sharedSizeBytes), default_limit,
                                opt_in_limit);
      if (plan.opt_in && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(plan.dynamic_bytes)) != cudaSuccess)
        return;
      kernel<<<blocks, row_threads(D / V), plan.dynamic_bytes, stream>>>(
          static_cast<const T*>(dy), static_cast<const T*>(h), w, rstd, static_cast<const T*>(dres),
          static_cast<T*>(dh), dw_part, db_part, N, D, plan.in_shared);
    });
  });
}

cudaError_t cross_entropy_rows(Dtype dt, void* z, int64_t ld, int64_t N, int64_t V, const int64_t* targets,
                               float* loss, bool grad, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    rows::with_width<T>(rows::rows_vectorizable<T>(V, ld, {z}), [&](auto width) {
      constexpr int W = decltype(width)::value;
      cross_entropy_kernel<T, W><<<row_blocks(N), row_threads(V / W), 0, stream>>>(static_cast<T*>(z), ld, N, V,
                                                                                   targets, loss, grad);
    });
  });
}

cudaError_t softmax_stats(Dtype dt, const void* z, int64_t ld, int64_t N, int64_t cols, int64_t valid,
                          const int64_t* targets, float* out, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    rows::with_width<T>(rows::rows_vectorizable<T>(cols, ld, {z}), [&](auto width) {
      constexpr int W = decltype(width)::value;
      softmax_stats_kernel<T, W><<<row_blocks(N), row_threads(valid / W), 0, stream>>>(static_cast<const T*>(z), ld,
                                                                                       N, valid, targets, out);
    });
  });
}

cudaError_t softmax_grad(Dtype dt, void* z, int64_t ld, int64_t N, int64_t valid, int64_t V, const int64_t* targets,
                         const float* lse, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    rows::with_width<T>(rows::rows_vectorizable<T>(V, ld, {z}), [&](auto width) {
      constexpr int W = decltype(width)::value;
      softmax_grad_kernel<T, W><<<row_blocks(N), row_threads(V / W), 0, stream>>>(static_cast<T*>(z), ld, N, valid,
                                                                                  V, targets, lse);
    });
  });
}

cudaError_t combine_rows(Dtype dt, const void* src, const int64_t* slot, const float* weight, int64_t k, void* out,
                         int64_t N, int64_t d, cudaStream_t stream) {
  if (N == 0 || d == 0) return cudaSuccess;
  return by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    rows::with_width<T>(rows::rows_vectorizable<T>(d, d, {src, out}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      combine_rows_kernel<T, V><<<warp_row_blocks(N), kWarpRowThreads, 0, stream>>>(
          static_cast<const T*>(src), slot, weight, k, static_cast<T*>(out), N, d);
    });
  });
}

cudaError_t spread_rows(Dtype dt, const void* src, const int64_t* owner, int64_t k, const float* weight, const void* y,
                        void* out, float* dweight, int64_t R, int64_t d, cudaStream_t stream) {
  if (R == 0 || d == 0) return cudaSuccess;
  return by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    rows::with_width<T>(rows::rows_vectorizable<T>(d, d, {src, y, out}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      spread_rows_kernel<T, V><<<warp_row_blocks(R), kWarpRowThreads, 0, stream>>>(
          static_cast<const T*>(src), owner, k, weight, static_cast<const T*>(y), static_cast<T*>(out), dweight, R, d);
    });
  });
}

cudaError_t adamw(Dtype moments, int64_t count, float* const* params, const float* const* grads, void* const* m,
                  void* const* v, void* const* casts, const int64_t* n, const adamw::Hyper& h, const float* step,
                  const float* grad_scale, const float* found_inf, const float* lr, cudaStream_t stream) {
  if (moments == Dtype::F16) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  adamw::plan_launches(count, n, [&](const adamw::LaunchPlan& lp) {
    if (err != cudaSuccess) return;
    AdamwTable t;
    for (int e = 0; e < lp.tensors; ++e) {
      const int64_t k = lp.tensor[e];
      t.p[e] = params[k];
      t.g[e] = grads[k];
      t.m[e] = m[k];
      t.v[e] = v[k];
      t.c[e] = casts ? static_cast<__nv_bfloat16*>(casts[k]) : nullptr;
      t.n[e] = n[k];
    }
    for (int b = 0; b < lp.blocks; ++b) {
      t.tensor_of[b] = lp.tensor_of[b];
      t.chunk_of[b] = lp.chunk_of[b];
    }
    if (moments == Dtype::BF16)
      adamw_kernel<__nv_bfloat16><<<lp.blocks, kAdamwThreads, 0, stream>>>(t, h, step, grad_scale, found_inf, lr);
    else
      adamw_kernel<float><<<lp.blocks, kAdamwThreads, 0, stream>>>(t, h, step, grad_scale, found_inf, lr);
    err = cudaGetLastError();
  });
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace meshtrain::ops::cuda
