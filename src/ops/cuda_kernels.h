#pragma once
// Launchers of the CUDA kernels (cuda_kernels.cu, built by nvcc without any
// libtorch header): raw pointers, sizes and a stream in, a CUDA error code
// out. cuda_ops.cpp turns tensors into these calls.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "row_math.h"

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
// out: [3, N] fp32 (max, sum, picked).
cudaError_t softmax_stats(Dtype dt, const void* z, int64_t ld, int64_t N, int64_t valid, const int64_t* targets,
                          float* out, cudaStream_t stream);
cudaError_t softmax_grad(Dtype dt, void* z, int64_t ld, int64_t N, int64_t valid, int64_t V, const int64_t* targets,
                         const float* lse, cudaStream_t stream);

}  // namespace meshtrain::ops::cuda
