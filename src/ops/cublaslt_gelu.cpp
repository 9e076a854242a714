// The CUDA side of meshtrain::linear_gelu / linear_dgelu (ops/gelu_gemm.h):
// one cuBLASLt matmul each, the GELU (or its derivative) in the epilogue.
// Row-major tensors are column-major transposes, so out[M, N] = x w^T is
// computed as out^T = w x^T: A = w, B = x, D = out, each [rows, cols] read
// as column-major [cols, rows]; the bias runs along D's column-major rows
// (the output features), as the epilogue adds it.
#ifdef MESHTRAIN_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <torch/torch.h>

#include "kernels.h"
#include "meshtrain/core/check.h"

namespace meshtrain::ops::impl {

namespace {

void lt_check(cublasStatus_t s, const char* what) {
  MT_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, " failed: status ", static_cast<int>(s));
}

cudaDataType_t lt_type(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
      return CUDA_R_32F;
    case at::kBFloat16:
      return CUDA_R_16BF;
    case at::kHalf:
      return CUDA_R_16F;
    default:
      MT_FAIL("cuBLASLt GELU GEMMs take fp32, bf16 or fp16, got ", s);
  }
}

// The largest power of two (at most 256) that divides the address: what the
// heuristic may assume of each operand (its default, 256, would rule out
// every algorithm for a less aligned one).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// A cuBLASLt object, destroyed with its scope; `set` writes an attribute.
template <class H, class Attr, cublasStatus_t (*Destroy)(H), cublasStatus_t (*SetAttr)(H, Attr, const void*, size_t)>
struct LtObject {
  H h = nullptr;
  LtObject() = default;
  LtObject(const LtObject&) = delete;
  LtObject& operator=(const LtObject&) = delete;
  ~LtObject() {
    if (h) Destroy(h);
  }
  template <class T>
  void set(Attr a, const T& v) {
    lt_check(SetAttr(h, a, &v, sizeof(v)), "attribute");
  }
};
using MatmulDesc = LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, cublasLtMatmulDescDestroy,
                            cublasLtMatmulDescSetAttribute>;
using Layout = LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, cublasLtMatrixLayoutDestroy,
                        cublasLtMatrixLayoutSetAttribute>;
using Preference = LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                            cublasLtMatmulPreferenceDestroy, cublasLtMatmulPreferenceSetAttribute>;

// l: a column-major rows x cols matrix with leading dimension ld, `batch` of
// them `stride` elements apart.
void make_layout(Layout& l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  lt_check(cublasLtMatrixLayoutCreate(&l.h, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
           "matrix layout");
  if (batch > 1) {
    l.set(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batch));
    l.set(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
}

// D[m, n] = op(A) B (column-major, A stored k x m when trans_a, else m x k;
// B k x n), `batch` times, with an epilogue that reads or writes aux
// (column-major m x n, ld m) and may add bias [m].
struct LtGemm {
  int64_t m, n, k, batch;
  bool trans_a;
  const void *a, *b;
  void* d;
  int64_t stride_a, stride_b, stride_d;  // elements between batch entries (D's is aux's too)
  cublasLtEpilogue_t epilogue;
  void* aux;
  const void* bias = nullptr;
  int64_t stride_bias = 0;
};

// Null where cuBLASLt ran the call; else why it did not (the caller computes
// the composite): no algorithm for the shapes and alignments, or the call
// not supported. Other errors throw.
const char* run(const LtGemm& g, at::ScalarType dtype, const at::Tensor& like) {
  if (g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0) return "an empty operand";
  const cudaDataType_t t = lt_type(dtype);
  MatmulDesc op;
  // fp32 accumulation and scale for every operand dtype (no TF32: torch's
  // fp32 matmuls default to full fp32 too).
  lt_check(cublasLtMatmulDescCreate(&op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  op.set(CUBLASLT_MATMUL_DESC_TRANSA, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  op.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  op.set(CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  op.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  op.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.m);
  op.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, static_cast<int32_t>(t));
  if (g.batch > 1) op.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, g.stride_d);
  if (g.bias) {
    op.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    op.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(t));
    if (g.batch > 1) op.set(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, g.stride_bias);
  }
  Layout la, lb, ld;
  make_layout(la, t, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.batch, g.stride_a);
  make_layout(lb, t, g.k, g.n, g.k, g.batch, g.stride_b);
  make_layout(ld, t, g.m, g.n, g.m, g.batch, g.stride_d);

  Preference pref;
  lt_check(cublasLtMatmulPreferenceCreate(&pref.h), "preference");
  // torch's own cuBLASLt workspace (one per handle and stream: this stream's).
  const size_t workspace_bytes = at::cuda::getCUDABlasLtWorkspaceSize();
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(g.a));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(g.b));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(g.d));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(g.d));

  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(handle, op.h, la.h, lb.h, ld.h, ld.h, pref.h, 1, &result, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) return "cuBLASLt has no algorithm for these shapes and alignments";
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t s = cublasLtMatmul(handle, op.h, &alpha, g.a, la.h, g.b, lb.h, &beta, g.d, ld.h, g.d, ld.h,
                                          &result.algo, at::cuda::getCUDABlasLtWorkspace(), workspace_bytes,
                                          at::cuda::getCurrentCUDAStream(like.device().index()).stream());
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return "cuBLASLt does not support the call";
  lt_check(s, "matmul");
  return nullptr;
}

}  // namespace

const char* lt_linear_gelu(const at::Tensor& x, const at::Tensor& w, const Opt& bias, at::Tensor& pre,
                           at::Tensor& h) {
  const c10::cuda::CUDAGuard guard(x.device());
  const bool batched = x.dim() == 3;
  const int64_t E = batched ? x.size(0) : 1, M = x.size(-2), K = x.size(-1), N = w.size(-2);
  LtGemm g{N, M, K, E, /*trans_a=*/true, w.const_data_ptr(), x.const_data_ptr(), h.data_ptr(), N * K, M * K, M * N,
           bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, pre.data_ptr()};
  if (bias) {
    g.bias = bias->const_data_ptr();
    g.stride_bias = N;
  }
  return run(g, x.scalar_type(), x);
}

const char* lt_linear_dgelu(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(dy.device());
  const bool batched = dy.dim() == 3;
  const int64_t E = batched ? dy.size(0) : 1, M = dy.size(-2), N = dy.size(-1), H = w.size(-1);
  // out^T [H, M] = w^T [H, N] (w row-major [N, H]: column-major H x N as stored) times dy^T [N, M].
  const LtGemm g{H, M, N, E, /*trans_a=*/false, w.const_data_ptr(), dy.const_data_ptr(), out.data_ptr(), N * H,
                 M * N, M * H, CUBLASLT_EPILOGUE_DGELU, const_cast<void*>(pre.const_data_ptr())};
  return run(g, dy.scalar_type(), dy);
}

}  // namespace meshtrain::ops::impl
#endif
