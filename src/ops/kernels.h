#pragma once
// The per-backend implementations behind the meshtrain operators
// (fused_ops.cpp registers them): CPU kernels (cpu_kernels.cpp), the aten
// composites (reference.cpp: CUDA builds without nvcc, and the tests'
// reference), and the CUDA kernels (cuda_ops.cpp, when built).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <tuple>

namespace meshtrain::ops::impl {

using Opt = std::optional<at::Tensor>;
using Norm = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
// spread_rows: the buffer rows and the weights' gradient (fp32 [N * k], or [0]).
using Spread = std::tuple<at::Tensor, at::Tensor>;

// Argument checks shared by every backend (shapes and dtypes; nothing read).
void check_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset, int64_t seq_dim,
                const at::Tensor& out);
void check_norm(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias);
// valid: the columns a vocabulary shard counts (softmax_stats/grad), at most the row's.
void check_rows(const at::Tensor& z, const at::Tensor& targets, int64_t valid = 0);
// meshtrain::adamw_ (ops/adamw.h): every list as long as params, each element
// of it contiguous, on one device, with params' element count; params and
// grads fp32, the moments all fp32 or all bf16; casts empty or bf16, one per
// parameter.
// meshtrain::combine_rows / spread_rows (ops/slot_rows.h): src 2-D with
// contiguous rows of a float type; slot [N, k] / owner [R] contiguous int64;
// weight contiguous fp32 of N * k elements; y [R, d] like src. Values are
// checked by the CPU kernels only (a GPU would need a host read).
void check_combine_rows(const at::Tensor& src, const at::Tensor& slot, const Opt& weight);
void check_spread_rows(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y);
void check_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
                 const at::Tensor& step, const Opt& grad_scale, const Opt& found_inf, at::TensorList casts,
                 const Opt& lr_tensor);

// The path the row kernels take for rows of `like`'s dtype, on every backend
// (row_math.h decides: 16-byte vectors or element by element), noted as
// op's path (ops/paths.h). True: vectors.
bool vector_rows(const char* op, const at::Tensor& like, int64_t cols, int64_t ld,
                 std::initializer_list<const void*> ptrs);
// The same for RoPE (x, out and the fp32 tables).
bool vector_rope(const at::Tensor& x, const at::Tensor& out, const at::Tensor& cos, const at::Tensor& sin,
                 int64_t seq_dim);

at::Tensor& rope_out_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                         int64_t seq_dim, bool inverse, at::Tensor& out);
Norm rms_norm_fwd_cpu(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias, double eps);
Norm rms_norm_bwd_cpu(const at::Tensor& dy, const at::Tensor& h, const at::Tensor& w, const at::Tensor& rstd,
                      const Opt& dres, bool bias);
at::Tensor cross_entropy_rows_cpu(at::Tensor& z, const at::Tensor& targets, bool grad);
at::Tensor softmax_stats_cpu(const at::Tensor& z, const at::Tensor& targets, int64_t valid);
at::Tensor& softmax_grad_cpu(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, int64_t valid);
at::Tensor combine_rows_cpu(const at::Tensor& src, const at::Tensor& slot, const Opt& weight);
Spread spread_rows_cpu(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y);
// lr_tensor (optional): the learning rate read on the device instead of lr.
void adamw_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
               const at::Tensor& step, double lr, double beta1, double beta2, double weight_decay, double eps,
               const Opt& grad_scale, const Opt& found_inf, const Opt& lr_tensor, at::TensorList casts);

at::Tensor& rope_out_ref(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                         int64_t seq_dim, bool inverse, at::Tensor& out);
Norm rms_norm_fwd_ref(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias, double eps);
Norm rms_norm_bwd_ref(const at::Tensor& dy, const at::Tensor& h, const at::Tensor& w, const at::Tensor& rstd,
                      const Opt& dres, bool bias);
at::Tensor cross_entropy_rows_ref(at::Tensor& z, const at::Tensor& targets, bool grad);
at::Tensor softmax_stats_ref(const at::Tensor& z, const at::Tensor& targets, int64_t valid);
at::Tensor& softmax_grad_ref(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, int64_t valid);
at::Tensor combine_rows_ref(const at::Tensor& src, const at::Tensor& slot, const Opt& weight);
Spread spread_rows_ref(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y);
void adamw_ref(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
               const at::Tensor& step, double lr, double beta1, double beta2, double weight_decay, double eps,
               const Opt& grad_scale, const Opt& found_inf, const Opt& lr_tensor, at::TensorList casts);

#ifdef MESHTRAIN_CUDA
// meshtrain::linear_gelu / linear_dgelu through cuBLASLt (cublaslt_gelu.cpp),
// writing the given outputs: null where cuBLASLt ran, else why it did not
// (no algorithm for the shapes; the caller computes the composite).
// Operands contiguous.
const char* lt_linear_gelu(const at::Tensor& x, const at::Tensor& w, const Opt& bias, at::Tensor& pre,
                           at::Tensor& h);
const char* lt_linear_dgelu(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& pre, at::Tensor& out);
#endif

#ifdef MESHTRAIN_CUDA_KERNELS
at::Tensor& rope_out_cuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                          int64_t seq_dim, bool inverse, at::Tensor& out);
Norm rms_norm_fwd_cuda(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias, double eps);
Norm rms_norm_bwd_cuda(const at::Tensor& dy, const at::Tensor& h, const at::Tensor& w, const at::Tensor& rstd,
                       const Opt& dres, bool bias);
at::Tensor cross_entropy_rows_cuda(at::Tensor& z, const at::Tensor& targets, bool grad);
at::Tensor softmax_stats_cuda(const at::Tensor& z, const at::Tensor& targets, int64_t valid);
at::Tensor& softmax_grad_cuda(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, int64_t valid);
at::Tensor combine_rows_cuda(const at::Tensor& src, const at::Tensor& slot, const Opt& weight);
Spread spread_rows_cuda(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y);
void adamw_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
                const at::Tensor& step, double lr, double beta1, double beta2, double weight_decay, double eps,
                const Opt& grad_scale, const Opt& found_inf, const Opt& lr_tensor, at::TensorList casts);
#endif

}  // namespace meshtrain::ops::impl
