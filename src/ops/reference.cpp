// The aten composites of the meshtrain operators (see kernels.h): what a CUDA
// build without nvcc runs, and what the tests hold the fused kernels to.
// Also the argument checks every backend shares.
#include <torch/torch.h>

#include "kernels.h"
#include "meshtrain/core/check.h"

namespace meshtrain::ops::impl {

namespace {

bool float_type(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kBFloat16 || s == at::kHalf;
}

// cos/sin rows offset.. for x's positions, shaped to broadcast against x's
// first half: [1.., T, 1.., half].
std::pair<at::Tensor, at::Tensor> rope_factors(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                               int64_t offset, int64_t seq_dim) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(seq_dim)] = x.size(seq_dim);
  shape.back() = x.size(-1) / 2;
  return {cos.narrow(0, offset, x.size(seq_dim)).reshape(shape), sin.narrow(0, offset, x.size(seq_dim)).reshape(shape)};
}

}  // namespace

void check_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset, int64_t seq_dim,
                const at::Tensor& out) {
  MT_ASSERT(x.dim() >= 2 && x.dim() <= 6, "rope: x must have 2 to 6 dims, got ", x.sizes());
  MT_ASSERT(seq_dim >= 0 && seq_dim < x.dim() - 1, "rope: seq_dim ", seq_dim, " out of range for ", x.sizes());
  MT_ASSERT(x.size(-1) % 2 == 0, "rope: an odd feature count ", x.size(-1));
  MT_ASSERT(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(), "rope: out ", out.sizes(), " vs x ",
            x.sizes());
  MT_ASSERT(x.stride(-1) == 1 && out.stride(-1) == 1, "rope: features must be contiguous");
  MT_ASSERT(float_type(x), "rope: unsupported dtype ", x.scalar_type());
  MT_ASSERT(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(1) == x.size(-1) / 2,
            "rope: tables must be contiguous fp32 [positions, ", x.size(-1) / 2, "], got ", cos.sizes());
  MT_ASSERT(offset >= 0 && offset + x.size(seq_dim) <= cos.size(0), "rope: positions ", offset, "..",
            offset + x.size(seq_dim), " beyond the table's ", cos.size(0));
}

void check_norm(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias) {
  MT_ASSERT(a.is_contiguous() && float_type(a), "rms_norm: input must be contiguous fp32/bf16/fp16, got ",
            a.scalar_type());
  MT_ASSERT(!b || (b->sizes() == a.sizes() && b->scalar_type() == a.scalar_type() && b->is_contiguous()),
            "rms_norm: the residual summands differ");
  MT_ASSERT(w.dim() == 1 && w.size(0) == a.size(-1) && w.scalar_type() == at::kFloat && w.is_contiguous(),
            "rms_norm: weight must be fp32 [", a.size(-1), "], got ", w.sizes(), " ", w.scalar_type());
  MT_ASSERT(!bias || (bias->sizes() == w.sizes() && bias->scalar_type() == at::kFloat && bias->is_contiguous()),
            "rms_norm: bias must be fp32 like the weight");
}

void check_rows(const at::Tensor& z, const at::Tensor& targets, int64_t valid) {
  MT_ASSERT(z.dim() == 2 && z.stride(1) == 1 && float_type(z), "cross-entropy rows: z must be [N, V] with unit "
            "column stride, got ", z.sizes());
  MT_ASSERT(targets.dim() == 1 && targets.size(0) == z.size(0) && targets.scalar_type() == at::kLong,
            "cross-entropy rows: ", z.size(0), " rows but targets ", targets.sizes(), " ", targets.scalar_type());
  MT_ASSERT(valid >= 0 && valid <= z.size(1), "cross-entropy rows: ", valid, " valid columns of a row of ",
            z.size(1));
}

void check_combine_rows(const at::Tensor& src, const at::Tensor& slot, const Opt& weight) {
  MT_ASSERT(src.dim() == 2 && src.is_contiguous() && float_type(src),
            "combine_rows: src must be contiguous [rows, d] fp32/bf16/fp16, got ", src.sizes(), " ", src.scalar_type());
  MT_ASSERT(slot.dim() == 2 && slot.is_contiguous() && slot.scalar_type() == at::kLong,
            "combine_rows: slot must be contiguous int64 [N, k], got ", slot.sizes(), " ", slot.scalar_type());
  MT_ASSERT(!weight || (weight->numel() == slot.numel() && weight->is_contiguous() &&
                        weight->scalar_type() == at::kFloat),
            "combine_rows: weight must be contiguous fp32 with one value per assignment (", slot.numel(), ")");
}

void check_spread_rows(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y) {
  MT_ASSERT(src.dim() == 2 && src.is_contiguous() && float_type(src),
            "spread_rows: src must be contiguous [N, d] fp32/bf16/fp16, got ", src.sizes(), " ", src.scalar_type());
  MT_ASSERT(k >= 1, "spread_rows: k must be >= 1, got ", k);
  MT_ASSERT(owner.dim() == 1 && owner.is_contiguous() && owner.scalar_type() == at::kLong,
            "spread_rows: owner must be contiguous int64 [rows], got ", owner.sizes(), " ", owner.scalar_type());
  MT_ASSERT(!weight || (weight->numel() == src.size(0) * k && weight->is_contiguous() &&
                        weight->scalar_type() == at::kFloat),
            "spread_rows: weight must be contiguous fp32 with one value per assignment (", src.size(0) * k, ")");
  MT_ASSERT(!y || (y->dim() == 2 && y->size(0) == owner.size(0) && y->size(1) == src.size(1) && y->is_contiguous() &&
                   y->scalar_type() == src.scalar_type()),
            "spread_rows: y must be contiguous [", owner.size(0), ", ", src.size(1), "] like src");
}

at::Tensor& rope_out_ref(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                         int64_t seq_dim, bool inverse, at::Tensor& out) {
  check_rope(x, cos, sin, offset, seq_dim, out);
  const int64_t half = x.size(-1) / 2;
  auto [c, s] = rope_factors(x, cos, sin, offset, seq_dim);
  if (inverse) s = -s;
  const at::Tensor a = x.narrow(-1, 0, half).to(at::kFloat), b = x.narrow(-1, half, half).to(at::kFloat);
  const at::Tensor y1 = a * c - b * s, y2 = b * c + a * s;  // both before out (may be x) is written
  out.narrow(-1, 0, half).copy_(y1);
  out.narrow(-1, half, half).copy_(y2);
  return out;
}

Norm rms_norm_fwd_ref(const at::Tensor& a, const Opt& b, const at::Tensor& w, const Opt& bias, double eps) {
  check_norm(a, b, w, bias);
  const at::Tensor h = b ? a + *b : at::empty({0}, a.options());
  const at::Tensor hf = (b ? h : a).to(at::kFloat);
  const at::Tensor rstd = at::rsqrt(hf.pow(2).mean(-1) + eps);
  at::Tensor y = hf * rstd.unsqueeze(-1) * w;
  if (bias) y = y + *bias;
  return {h, y.to(a.scalar_type()), rstd};
}

Norm rms_norm_bwd_ref(const at::Tensor& dy, const at::Tensor& h, const at::Tensor& w, const at::Tensor& rstd,
                      const Opt& dres, bool bias) {
  const at::Tensor g = dy.to(at::kFloat), r = rstd.unsqueeze(-1);
  const at::Tensor xhat = h.to(at::kFloat) * r;
  const at::Tensor gw = g * w;
  const at::Tensor dot = (gw * xhat).mean(-1, /*keepdim=*/true);
  at::Tensor dh = r * (gw - xhat * dot);
  if (dres) dh = dh + dres->to(at::kFloat);
  const int64_t D = h.size(-1);
  const at::Tensor dw = (g * xhat).reshape({-1, D}).sum(0);
  const at::Tensor db = bias ? g.reshape({-1, D}).sum(0) : at::empty({0}, w.options());
  return {dh.to(h.scalar_type()), dw, db};
}

at::Tensor softmax_stats_ref(const at::Tensor& z, const at::Tensor& targets, int64_t valid) {
  check_rows(z, targets, valid);
  const at::Tensor zf = z.narrow(1, 0, valid).to(at::kFloat);
  const at::Tensor m = std::get<0>(zf.max(1));
  const at::Tensor s = (zf - m.unsqueeze(1)).exp().sum(1);
  const at::Tensor in = (targets >= 0) & (targets < valid);
  const at::Tensor picked = zf.gather(1, targets.clamp(0, valid - 1).unsqueeze(1)).squeeze(1).masked_fill(~in, 0.0);
  return at::stack({m, s, picked});
}

at::Tensor& softmax_grad_ref(at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, int64_t valid) {
  check_rows(z, targets, valid);
  at::Tensor p = at::zeros(z.sizes(), z.options().dtype(at::kFloat));
  p.narrow(1, 0, valid).copy_((z.narrow(1, 0, valid).to(at::kFloat) - lse.unsqueeze(1)).exp());
  const at::Tensor in = (targets >= 0) & (targets < valid);
  p.scatter_add_(1, targets.clamp(0, valid - 1).unsqueeze(1), -in.to(at::kFloat).unsqueeze(1));
  z.copy_(p);
  return z;
}

at::Tensor cross_entropy_rows_ref(at::Tensor& z, const at::Tensor& targets, bool grad) {
  const int64_t V = z.size(1);
  const at::Tensor st = softmax_stats_ref(z, targets, V);
  const at::Tensor lse = st[0] + st[1].log();
  const at::Tensor loss = lse - st[2];
  if (grad) softmax_grad_ref(z, targets, lse, V);
  return loss;
}

// Gathered rows widened to fp32, weighted (0 where the assignment has no
// row), summed over k.
at::Tensor combine_rows_ref(const at::Tensor& src, const at::Tensor& slot, const Opt& weight) {
  check_combine_rows(src, slot, weight);
  const int64_t N = slot.size(0), k = slot.size(1), d = src.size(1);
  if (src.size(0) == 0) return at::zeros({N, d}, src.options());
  const at::Tensor held = slot >= 0;
  const at::Tensor rows = src.index_select(0, slot.clamp_min(0).reshape({N * k})).view({N, k, d}).to(at::kFloat);
  at::Tensor w = held.to(at::kFloat);
  if (weight) w = w * weight->reshape({N, k});
  return (rows * w.unsqueeze(2)).sum(1).to(src.scalar_type());
}

Spread spread_rows_ref(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y) {
  check_spread_rows(src, owner, k, weight, y);
  const int64_t R = owner.size(0), A = src.size(0) * k, d = src.size(1);
  const auto f32 = src.options().dtype(at::kFloat);
  at::Tensor dw = y ? at::zeros({A}, f32) : at::empty({0}, f32);
  if (A == 0) return {at::zeros({R, d}, src.options()), dw};
  const at::Tensor held = (owner >= 0).to(at::kFloat), a = owner.clamp_min(0);
  const at::Tensor x = src.index_select(0, a.div(k, "floor")).to(at::kFloat);
  at::Tensor w = held;
  if (weight) w = w * weight->reshape({A}).index_select(0, a);
  if (y) dw.index_add_(0, a, (x * y->to(at::kFloat)).sum(1) * held);
  return {(x * w.unsqueeze(1)).to(src.scalar_type()), dw};
}

}  // namespace meshtrain::ops::impl
