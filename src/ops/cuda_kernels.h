#pragma once
// Launchers of the CUDA kernels (cuda_kernels.cu, built by nvcc without any
// libtorch header): raw pointers, sizes and a stream in, a CUDA error code
// out. cuda_ops.cpp turns tensors into these calls.
//
// Launch shapes (the constants in cuda_kernels.cu; the arithmetic of every
// kernel is row_math.h's, adamw_math.h's or slot_math.h's, shared with the
// CPU kernels):
//   rope             256-thread blocks over grid-stride work items: each
//                    thread takes rows::kRopePairsPerThread (8) adjacent pairs
//                    of one row, or one 16-byte vector of each half where
//                    rows::rope_vectorizable says every access is aligned;
//                    the item's index is split over the tensor's dims with
//                    rows::FastDiv (32-bit) where every pair index fits.
//   rms_norm_fwd     rows of at most 2048 elements: a warp per row (256-thread
//                    blocks, 8 rows each; half the time of a block per row at
//                    GPT-2's 768 on an H100); wider rows: a block per row.
//   rms_norm_bwd     `blocks` blocks (cuda_ops.cpp: min(N, 1024)) over the
//                    rows, each of row_threads(D / V) threads; a thread visits
//                    the same columns in every row and owns their dw / db sums
//                    (no atomics, no barrier), kept in shared memory where
//                    they fit (launch_plan.h: opting in past 48 KiB up to the
//                    device's limit) and written once to the block's row of
//                    dw_part / db_part, which the caller sums over blocks.
//   cross_entropy_rows, softmax_stats, softmax_grad
//                    a block per row (row_threads: 128 to 1024 threads by the
//                    row's vectors), the online max and sum reduced over the
//                    block's warps (BlockLanes).
//   combine_rows, spread_rows
//                    a warp per row (256-thread blocks).
//   adamw            multi-tensor: a 512-thread block per chunk of 65536
//                    elements, at most 36 tensors and 320 chunks a launch
//                    (adamw_math.h plans them on the host).
// V (the vector width) is rows::kVec<T> (16 bytes of T) where
// rows::rows_vectorizable says every row and per-column vector starts
// 16-byte aligned, else 1; rows::with_width picks it the same way for the
// CPU kernels, and ops/paths.h reports which was taken.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "adamw_math.h"
#include "row_math.h"
#include "slot_math.h"

namespace meshtrain::ops::cuda {

enum class Dtype { F32, BF16, F16 };

cudaError_t rope(Dtype dt, const rows::Strided& s, const void* x, void* out, const float* cos, const float* sin,
                 int64_t offset, bool inverse, cudaStream_t stream);
cudaError_t rms_norm_fwd(Dtype dt, const void* a, const void* b, const float* w, const float* bias, void* h, void* y,
                         float* rstd, int64_t N, int64_t D, float eps, cudaStream_t stream);
// dw_part / db_part: [blocks, D] fp32, zeroed by the caller; block i adds its rows' sums to row i.
cudaError_t rms_norm_bwd(Dtype dt, const void* dy, const void* h, const float* w, const float* rstd, const void* dres,
                         void* dh, float* dw_part, float* db_part, int64_t N, int64_t D, int blocks,
                         cudaStream_t stream);
cudaError_t cross_entropy_rows(Dtype dt, void* z, int64_t ld, int64_t N, int64_t V, const int64_t* targets,
                               float* loss, bool grad, cudaStream_t stream);
// out: [3, N] fp32 (max, sum, picked) over the first `valid` of a row's `cols` columns.
cudaError_t softmax_stats(Dtype dt, const void* z, int64_t ld, int64_t N, int64_t cols, int64_t valid,
                          const int64_t* targets, float* out, cudaStream_t stream);
cudaError_t softmax_grad(Dtype dt, void* z, int64_t ld, int64_t N, int64_t valid, int64_t V, const int64_t* targets,
                         const float* lse, cudaStream_t stream);

// ops/slot_rows.h, a warp per row: out [N, d] = the weighted sum of each
// token's k rows of src (slot [N, k], -1: none; weight null: 1) ...
cudaError_t combine_rows(Dtype dt, const void* src, const int64_t* slot, const float* weight, int64_t k, void* out,
                         int64_t N, int64_t d, cudaStream_t stream);
// ... and out [R, d] = weight[owner] * src[owner / k], zero where owner < 0;
// with y, dweight[owner[r]] = dot(src[owner / k], y[r]) (dweight zeroed by
// the caller: assignments without a row keep 0).
cudaError_t spread_rows(Dtype dt, const void* src, const int64_t* owner, int64_t k, const float* weight, const void* y,
                        void* out, float* dweight, int64_t R, int64_t d, cudaStream_t stream);

// AdamW over `count` tensors: params[k], grads[k] (fp32), m[k], v[k] (moments
// of dtype `moments`, F32 or BF16), n[k] elements each, in as few launches as
// their pointers fit (multi-tensor: a block per chunk of a tensor). step,
// grad_scale, found_inf: device scalars (the last two may be null). casts:
// null, or count bf16 buffers of n[k] elements that get the new weights.
// lr (a device scalar, or null for h.lr): read by every block (graphs).
cudaError_t adamw(Dtype moments, int64_t count, float* const* params, const float* const* grads, void* const* m,
                  void* const* v, void* const* casts, const int64_t* n, const adamw::Hyper& h, const float* step,
                  const float* grad_scale, const float* found_inf, const float* lr, cudaStream_t stream);

}  // namespace meshtrain::ops::cuda
