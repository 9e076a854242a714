// FP8 GEMMs of the linear layers as autograd functions (see fp8_linear.h).
#include "meshtrain/model/fp8_linear.h"

#include <torch/torch.h>

#include <optional>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"

namespace meshtrain {

using ops::Fp8Granularity;
using ops::Fp8Tensor;

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool symmetric(Fp8Granularity g) { return g == Fp8Granularity::kTensor || g == Fp8Granularity::kBlock; }

// Both reductions, one after the other (the max over a product of groups).
AmaxReduce both(const AmaxReduce& a, const AmaxReduce& b) {
  if (!a) return b;
  if (!b) return a;
  return [a, b](at::Tensor& t) {
    a(t);
    b(t);
  };
}

// The reduction for scale groups spanning tokens: the layer's own (a
// sequence shard) and context parallelism's.
AmaxReduce token_reduce(const MixedPrecision& mp, const Fp8Split& split) {
  return both(split.tokens, mp.fp8_token_reduce());
}

// q read transposed ([.., C, R]), row-major.
Fp8Tensor transpose_of(const Fp8Tensor& q) {
  Fp8Tensor t = q.transposed();
  t.data = t.data.contiguous();
  t.scale = t.scale.contiguous();
  return t;
}

// The weight-gradient GEMMs' operands of t [.., R, C] (quantized as q for
// the forward or input-gradient GEMM): q transposed where its tiles are
// symmetric, else t^T quantized anew (its groups along R now, reduced over
// what splits R).
Fp8Tensor for_weight_grad(const Fp8Tensor& q, const at::Tensor& t, Fp8Operand op, const AmaxReduce& rows_of_t,
                          const AmaxReduce& cols_of_t) {
  if (symmetric(op.granularity)) return transpose_of(q);
  return fp8_quantize(t.transpose(-2, -1), op, cols_of_t, rows_of_t);
}

MixedPrecision& precision_of(AutogradContext* ctx) {
  return *reinterpret_cast<MixedPrecision*>(ctx->saved_data["precision"].toInt());
}
const Fp8Split& split_of(AutogradContext* ctx) {
  return *reinterpret_cast<const Fp8Split*>(ctx->saved_data["split"].toInt());
}

// fp8_linear: y = [x W_1^T, x W_2^T, ..] (+ b or residual).
class Fp8LinearFn : public torch::autograd::Function<Fp8LinearFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                            const std::optional<at::Tensor>& residual, int64_t precision, int64_t split) {
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    const auto& sp = *reinterpret_cast<const Fp8Split*>(split);
    const Fp8Plan plan = Fp8Plan::of(mp.policy().fp8);
    const at::Tensor xc = mp.operand(x);
    const at::Tensor x2 = xc.reshape({-1, xc.size(-1)});
    const Fp8Tensor xq = fp8_quantize(x2, plan.x, token_reduce(mp, sp), sp.in);
    // Each product leaves its GEMM in the compute dtype; a bias or the
    // residual is added to it there (as an unfused bf16 linear adds them).
    std::vector<at::Tensor> parts;
    std::vector<int64_t> rows;
    for (const at::Tensor& w : weights) {
      parts.push_back(ops::fp8_mm(xq, mp.fp8_weight(w, false), mp.activation_dtype()));
      rows.push_back(w.size(0));
    }
    at::Tensor y = parts.size() == 1 ? parts[0] : at::cat(parts, 1);  // [M, sum N], this function's own
    if (!biases.empty()) {
      std::vector<at::Tensor> b;
      for (const at::Tensor& t : biases) b.push_back(mp.operand_detached(t));
      y.add_(b.size() == 1 ? b[0] : at::cat(b, 0));
    }
    if (residual) y.add_(residual->reshape(y.sizes()));
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = y.size(1);
    ctx->save_for_backward({xc, symmetric(plan.x.granularity) ? xq.data : at::Tensor(), xq.scale});
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["weights"] = weights.vec();
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["b_dtype"] = biases.empty() ? at::kFloat : biases[0].scalar_type();
    ctx->saved_data["biases"] = !biases.empty();
    ctx->saved_data["residual"] = residual.has_value();
    ctx->saved_data["precision"] = precision;
    ctx->saved_data["split"] = split;
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& xc = saved[0];
    MixedPrecision& mp = precision_of(ctx);
    const Fp8Split& sp = split_of(ctx);
    const Fp8Plan plan = Fp8Plan::of(mp.policy().fp8);
    const AmaxReduce tokens = token_reduce(mp, sp);
    const at::Tensor x2 = xc.reshape({-1, xc.size(-1)});
    const std::vector<at::Tensor> weights = ctx->saved_data["weights"].toTensorVector();
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    int64_t width = 0;
    for (int64_t r : rows) width += r;
    const at::Tensor g2 = grads[0].to(xc.scalar_type()).reshape({-1, width});
    // x's operand of every weight gradient: made once.
    const Fp8Tensor xq{saved[1], saved[2], plan.x.granularity};
    const Fp8Tensor xt = for_weight_grad(xq, x2, plan.x, tokens, sp.in);
    at::Tensor dx;
    variable_list out(1);
    int64_t col = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      const at::Tensor g = g2.narrow(1, col, rows[i]);
      col += rows[i];
      const Fp8Tensor gq = fp8_quantize(g, plan.dy, tokens, sp.out);
      if (ctx->needs_input_grad(0)) {
        // One weight: dx leaves its GEMM in x's dtype; several: summed in fp32 first.
        const at::ScalarType dt = weights.size() == 1 ? ctx->saved_data["x_dtype"].toScalarType() : at::kFloat;
        const at::Tensor part = ops::fp8_mm(gq, mp.fp8_weight(weights[i], true), dt);
        dx = dx.defined() ? dx.add_(part) : part;
      }
      const Fp8Tensor gt = for_weight_grad(gq, g, plan.dy, tokens, sp.out);
      out.push_back(param_weight_grad(weights[i], [gt, xt] { return ops::fp8_mm(gt, xt, at::kFloat); }, &mp));
    }
    if (dx.defined()) out[0] = dx.view(xc.sizes()).to(ctx->saved_data["x_dtype"].toScalarType());
    if (ctx->saved_data["biases"].toBool()) {
      const at::Tensor db = at::sum(g2, {0}, false, ctx->saved_data["b_dtype"].toScalarType());
      int64_t at_row = 0;
      for (int64_t r : rows) {
        out.push_back(db.narrow(0, at_row, r));
        at_row += r;
      }
    }
    out.push_back(ctx->saved_data["residual"].toBool() ? grads[0] : at::Tensor());
    out.push_back(at::Tensor());
    out.push_back(at::Tensor());
    return out;
  }
};

// A quantized weight [E, .., ..] read by `segments` row blocks of each
// expert: each expert's operand repeated, [E * segments, .., ..].
Fp8Tensor per_segment(const Fp8Tensor& w, int64_t segments) {
  if (segments == 1) return w;
  const auto rep = [&](const at::Tensor& t) {
    std::vector<int64_t> shape = t.sizes().vec();
    shape.insert(shape.begin() + 1, segments);
    std::vector<int64_t> flat = t.sizes().vec();
    flat[0] *= segments;
    return t.unsqueeze(1).expand(shape).reshape(flat);
  };
  return {rep(w.data), rep(w.scale), w.granularity};
}

// fp8_batched_linear: x [E, G * S, K] as [E * G, S, K], each block its own
// operand, times its expert's weight.
class Fp8BatchedFn : public torch::autograd::Function<Fp8BatchedFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t precision,
                            int64_t split, int64_t segments) {
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    const auto& sp = *reinterpret_cast<const Fp8Split*>(split);
    const Fp8Plan plan = Fp8Plan::of(mp.policy().fp8);
    const int64_t E = x.size(0), S = x.size(1) / segments;
    const at::Tensor xs = mp.operand(x).reshape({E * segments, S, x.size(2)});
    const Fp8Tensor xq = fp8_quantize(xs, plan.x, token_reduce(mp, sp), sp.in);
    const at::Tensor y = ops::fp8_mm(xq, per_segment(mp.fp8_weight(w, false), segments), mp.activation_dtype());
    ctx->save_for_backward({xs, symmetric(plan.x.granularity) ? xq.data : at::Tensor(), xq.scale});
    ctx->saved_data["w"] = w;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["precision"] = precision;
    ctx->saved_data["split"] = split;
    ctx->saved_data["segments"] = segments;
    return y.view({E, segments * S, w.size(1)});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& xs = saved[0];
    MixedPrecision& mp = precision_of(ctx);
    const Fp8Split& sp = split_of(ctx);
    const Fp8Plan plan = Fp8Plan::of(mp.policy().fp8);
    const AmaxReduce tokens = token_reduce(mp, sp);
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const int64_t segments = ctx->saved_data["segments"].toInt(), E = w.size(0);
    const at::Tensor g = grads[0].to(xs.scalar_type()).reshape({xs.size(0), xs.size(1), w.size(1)});
    const Fp8Tensor gq = fp8_quantize(g, plan.dy, tokens, sp.out);
    const at::Tensor dx =
        ops::fp8_mm(gq, per_segment(mp.fp8_weight(w, true), segments), ctx->saved_data["x_dtype"].toScalarType())
            .view({E, -1, w.size(2)});
    const Fp8Tensor gt = for_weight_grad(gq, g, plan.dy, tokens, sp.out);
    const Fp8Tensor xt = for_weight_grad({saved[1], saved[2], plan.x.granularity}, xs, plan.x, tokens, sp.in);
    // Each block's product in fp32, summed over an expert's blocks in fp32.
    const auto dw = [gt, xt, E, segments] {
      const at::Tensor p = ops::fp8_mm(gt, xt, at::kFloat);
      return segments == 1 ? p : p.view({E, segments, p.size(1), p.size(2)}).sum(1);
    };
    return {dx, param_weight_grad(w, dw, &mp), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// --- The dropless grouped GEMM: exact emulation over dequantized operands.

// x's quantization `q` under an element-wise amax (broadcastable to x),
// dequantized: quantize_fp8's formulas (s = max / amax in fp32, saturate(x s),
// times 1 / s) with each element's own scale.
at::Tensor fake_quant(const at::Tensor& x, const at::Tensor& amax, at::ScalarType dtype) {
  const at::Tensor s = at::full_like(amax, ops::fp8_max(dtype)).div_(amax.clamp_min(ops::kFp8AmaxFloor));
  return ops::fp8_saturated_cast(x.to(at::kFloat) * s, dtype).to(at::kFloat) * s.reciprocal();
}

// The max of |x [M, C]| over the rows of each group (group [M] int64 in
// [0, n)) per column -> [n, C], or over whole groups (`whole`) -> [n, 1].
at::Tensor group_amax(const at::Tensor& x, const at::Tensor& group, int64_t n, bool whole) {
  const at::Tensor a = whole ? at::linalg_vector_norm(x.to(at::kFloat), INFINITY, at::IntArrayRef{1}, true)
                             : x.to(at::kFloat).abs();
  const at::Tensor index = group.unsqueeze(1).expand({a.size(0), a.size(1)});
  return at::zeros({n, a.size(1)}, a.options()).scatter_reduce_(0, index, a, "amax", /*include_self=*/true);
}

// rows [M, C] (C the reduction of the forward or input-gradient GEMM) as
// `op` quantizes them, dequantized: a tensorwise scale per group of rows.
at::Tensor rows_operand(const at::Tensor& rows, Fp8Operand op, const at::Tensor& group, int64_t n,
                        const AmaxReduce& tokens, const AmaxReduce& cols) {
  if (op.granularity != Fp8Granularity::kTensor) return fp8_quantize(rows, op, {}, cols).dequantize();
  at::Tensor amax = group_amax(rows, group, n, true).contiguous();
  if (tokens) tokens(amax);
  if (cols) cols(amax);
  return fake_quant(rows, amax.index_select(0, group), op.dtype);
}

// rows [M, C] as the weight gradient reads them (reduction over the rows),
// dequantized: tensorwise as rows_operand; rowwise a scale per (group,
// column); blockwise per (128-row tile of a group, column).
at::Tensor tokens_operand(const at::Tensor& rows, Fp8Operand op, const at::Tensor& group, int64_t n,
                          const AmaxReduce& tokens, const AmaxReduce& cols) {
  if (op.granularity == Fp8Granularity::kTensor) return rows_operand(rows, op, group, n, tokens, cols);
  at::Tensor tile = group;
  int64_t tiles = n;
  if (op.granularity != Fp8Granularity::kRow) {
    // Tiles are never reduced over ranks (config validation keeps each on one).
    MT_ASSERT(!tokens, "FP8 blockwise: 128-token tiles split over ranks");
    // A row's tile: its group's first tile plus its place in the group / 128.
    const int64_t m = rows.size(0), b = ops::kFp8BlockSize;
    const at::Tensor count = at::zeros({n}, group.options()).scatter_add_(0, group, at::ones_like(group));
    const at::Tensor start = count.cumsum(0) - count;  // the groups' first rows
    const at::Tensor first_tile = ((count + b - 1).div(b, "floor")).cumsum(0) - (count + b - 1).div(b, "floor");
    const at::Tensor place = at::arange(m, group.options()) - start.index_select(0, group);
    tile = first_tile.index_select(0, group) + place.div(b, "floor");
    tiles = m / b + n;  // at least as many as there are
  }
  at::Tensor amax = group_amax(rows, tile, tiles, false).contiguous();
  if (tokens && op.granularity == Fp8Granularity::kRow) tokens(amax);
  return fake_quant(rows, amax.index_select(0, tile), op.dtype);
}

at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  return at::_grouped_mm(a, b, offs);
}

class Fp8GroupedFn : public torch::autograd::Function<Fp8GroupedFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& w, const at::Tensor& offs,
                            const at::Tensor& group, int64_t n_groups, int64_t precision, int64_t split) {
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    const auto& sp = *reinterpret_cast<const Fp8Split*>(split);
    const Fp8Plan plan = Fp8Plan::of(mp.policy().fp8);
    const at::Tensor xc = mp.operand(rows);
    const at::Tensor xd = rows_operand(xc, plan.x, group, n_groups, token_reduce(mp, sp), sp.in);
    const at::Tensor wd = mp.fp8_weight(w, false).dequantize();  // [E, N, K]
    ctx->save_for_backward({xc, offs, group});
    ctx->saved_data["w"] = w;
    ctx->saved_data["n"] = n_groups;
    ctx->saved_data["x_dtype"] = rows.scalar_type();
    ctx->saved_data["precision"] = precision;
    ctx->saved_data["split"] = split;
    return grouped_mm(xd, wd.transpose(1, 2), offs).to(mp.activation_dtype());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xc = saved[0], &offs = saved[1], &group = saved[2];
    MixedPrecision& mp = precision_of(ctx);
    const Fp8Split& sp = split_of(ctx);
    const Fp8Plan plan = Fp8Plan::of(mp.policy().fp8);
    const AmaxReduce tokens = token_reduce(mp, sp);
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const int64_t n = ctx->saved_data["n"].toInt();
    const at::Tensor g = grads[0].to(xc.scalar_type());
    const at::Tensor gd = rows_operand(g, plan.dy, group, n, tokens, sp.out);
    const at::Tensor wt = mp.fp8_weight(w, true).dequantize();  // [E, K, N]
    const at::Tensor dx = grouped_mm(gd, wt.transpose(1, 2), offs).to(ctx->saved_data["x_dtype"].toScalarType());
    const at::Tensor gt = tokens_operand(g, plan.dy, group, n, tokens, sp.out);
    const at::Tensor xt = tokens_operand(xc, plan.x, group, n, tokens, sp.in);
    const auto dw = [gt, xt, offs] { return grouped_mm(gt.t(), xt, offs); };
    return {dx, param_weight_grad(w, dw, &mp), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Fp8Plan Fp8Plan::of(Fp8Recipe recipe) {
  const auto e4 = at::kFloat8_e4m3fn, e5 = at::kFloat8_e5m2;
  switch (recipe) {
    case Fp8Recipe::Tensorwise:
      return {{e4, Fp8Granularity::kTensor}, {e4, Fp8Granularity::kTensor}, {e5, Fp8Granularity::kTensor}};
    case Fp8Recipe::Rowwise:
      return {{e4, Fp8Granularity::kRow}, {e4, Fp8Granularity::kRow}, {e4, Fp8Granularity::kRow}};
    case Fp8Recipe::Blockwise:
      return {{e4, Fp8Granularity::kTile}, {e4, Fp8Granularity::kBlock}, {e4, Fp8Granularity::kTile}};
    case Fp8Recipe::None: break;
  }
  MT_FAIL("Fp8Plan::of: no FP8 recipe");
}

Fp8Tensor fp8_quantize(const at::Tensor& t, Fp8Operand op, const AmaxReduce& rows, const AmaxReduce& cols) {
  // A tensor's scale group spans both dims, a row's the reduction; tiles and
  // blocks stay on one rank (config validation).
  const bool whole = op.granularity == Fp8Granularity::kTensor, by_row = op.granularity == Fp8Granularity::kRow;
  const bool reduce_rows = whole && rows, reduce_cols = (whole || by_row) && cols;
  if (!reduce_rows && !reduce_cols) return ops::quantize_fp8(t, op.dtype, op.granularity);
  at::Tensor amax = ops::fp8_amax(t, op.granularity).contiguous();
  if (reduce_rows) rows(amax);
  if (reduce_cols) cols(amax);
  return ops::quantize_fp8(t, op.dtype, op.granularity, amax);
}

at::Tensor fp8_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases, const at::Tensor& residual,
                      MixedPrecision& precision, const Fp8Split& split) {
  MT_ASSERT(!weights.empty() && (biases.empty() || biases.size() == weights.size()) &&
                !(residual.defined() && !biases.empty()),
            "fp8_linear: ", weights.size(), " weights, ", biases.size(), " biases",
            residual.defined() ? " and a residual" : "");
  return Fp8LinearFn::apply(x, weights, biases, residual.defined() ? std::optional<at::Tensor>(residual) : std::nullopt,
                            reinterpret_cast<int64_t>(&precision), reinterpret_cast<int64_t>(&split));
}

at::Tensor fp8_batched_linear(const at::Tensor& x, const at::Tensor& w, MixedPrecision& precision,
                              const Fp8Split& split, int64_t segments) {
  MT_ASSERT(x.dim() == 3 && w.dim() == 3 && x.size(0) == w.size(0) && x.size(2) == w.size(2) && segments >= 1 &&
                x.size(1) % segments == 0,
            "fp8_batched_linear: x ", x.sizes(), " and w ", w.sizes(), " in ", segments, " segments do not match");
  return Fp8BatchedFn::apply(x, w, reinterpret_cast<int64_t>(&precision), reinterpret_cast<int64_t>(&split),
                             segments);
}

at::Tensor fp8_grouped_linear(const at::Tensor& rows, const at::Tensor& w, const at::Tensor& counts,
                              const at::Tensor& row_group, int64_t n_groups, MixedPrecision& precision,
                              const Fp8Split& split) {
  MT_ASSERT(rows.dim() == 2 && w.dim() == 3 && rows.size(1) == w.size(2) && counts.size(0) == w.size(0) &&
                row_group.size(0) == rows.size(0),
            "fp8_grouped_linear: rows ", rows.sizes(), ", w ", w.sizes(), ", counts ", counts.sizes(), " and groups ",
            row_group.sizes(), " do not match");
  const at::Tensor offs = counts.cumsum(0).to(at::kInt);
  return Fp8GroupedFn::apply(rows, w, offs, row_group, n_groups, reinterpret_cast<int64_t>(&precision),
                             reinterpret_cast<int64_t>(&split));
}

}  // namespace meshtrain
