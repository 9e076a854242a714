// ops/fp8.h: FP8 quantization (amax, scale, saturating cast per tile) and the
// FP8 GEMM (at::_scaled_mm, or its exact emulation), as aten math that runs
// on every device.
#include "meshtrain/ops/fp8.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/ops/paths.h"

namespace meshtrain::ops {

namespace {

bool is_fp8(at::ScalarType s) { return s == at::kFloat8_e4m3fn || s == at::kFloat8_e5m2; }

bool is_float(at::ScalarType s) { return s == at::kFloat || s == at::kBFloat16 || s == at::kHalf; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One dim of a scale grid (g entries, a tile of `tile` elements) stretched
// over `n` elements: g itself where it is 1 (broadcasts) or the tile is 1,
// else each entry repeated over its tile, the last one cut at n.
at::Tensor stretch(const at::Tensor& grid, int64_t dim, int64_t tile, int64_t n) {
  if (grid.size(dim) == 1 || tile == 1) return grid;
  return grid.repeat_interleave(tile, dim).narrow(dim, 0, n);
}

// The scale grid of t stretched over t's [.., R, K] (broadcastable to it).
at::Tensor stretch_grid(const Fp8Tensor& t) {
  const int64_t rows = t.data.size(-2), cols = t.data.size(-1);
  const auto tile = fp8_tile(t.granularity, rows, cols);
  return stretch(stretch(t.scale, -2, tile[0], rows), -1, tile[1], cols);
}

void check_operand(const Fp8Tensor& t, const char* name) {
  MT_ASSERT(t.data.defined() && (t.data.dim() == 2 || t.data.dim() == 3) && is_fp8(t.data.scalar_type()),
            "fp8_mm: ", name, " must be a 2-D or 3-D fp8 tensor");
  const auto grid = fp8_scale_grid(t.granularity, t.data.size(-2), t.data.size(-1));
  std::vector<int64_t> want{grid[0], grid[1]};
  if (t.data.dim() == 3) want.insert(want.begin(), t.data.size(0));
  MT_ASSERT(t.scale.scalar_type() == at::kFloat && t.scale.sizes() == at::IntArrayRef(want), "fp8_mm: ", name,
            "'s scales ", t.scale.sizes(), " ", t.scale.scalar_type(), " are not the fp32 ", at::IntArrayRef(want),
            " of ", fp8_granularity_name(t.granularity), " scaling over ", t.data.sizes());
}

// The scales of reduction chunk c ([k0, k0 + width)) of t, one per row of t,
// broadcastable to [.., R, 1]: a grid of one column scales all of K.
at::Tensor chunk_scales(const Fp8Tensor& t, int64_t c) {
  const int64_t col = t.scale.size(-1) == 1 ? 0 : c;
  const auto tile = fp8_tile(t.granularity, t.data.size(-2), t.data.size(-1));
  return stretch(t.scale.narrow(-1, col, 1), -2, tile[0], t.data.size(-2));
}

// x [R, K] or [E, R, K] in fp32 as its scale tiles [E, Gr, tr, Gc, tc]
// (E = 1 for a matrix), the last tiles of each dim padded with zeros (which
// change no max |x|) to whole ones.
at::Tensor as_tiles(const at::Tensor& x, Fp8Granularity g) {
  MT_ASSERT((x.dim() == 2 || x.dim() == 3) && is_float(x.scalar_type()),
            "fp8 quantization: x must be a 2-D or 3-D float tensor, got ", x.sizes(), " ", x.scalar_type());
  const int64_t batch = x.dim() == 3 ? x.size(0) : 1, rows = x.size(-2), cols = x.size(-1);
  const auto tile = fp8_tile(g, rows, cols);
  const auto grid = fp8_scale_grid(g, rows, cols);
  at::Tensor padded = x.to(at::kFloat).contiguous();
  // An empty x: one zero per tile, so every tile's amax is 0.
  if (x.numel() == 0) return at::zeros({batch, grid[0], 1, grid[1], 1}, padded.options());
  const int64_t pad_rows = grid[0] * tile[0] - rows, pad_cols = grid[1] * tile[1] - cols;
  if (pad_rows > 0 || pad_cols > 0) padded = at::constant_pad_nd(padded, {0, pad_cols, 0, pad_rows}, 0);
  return padded.view({batch, grid[0], tile[0], grid[1], tile[1]});
}

// max |x| per tile of as_tiles' [E, Gr, tr, Gc, tc] -> [E, Gr, Gc]: the
// inf-norm, one pass, NaN-propagating, with a meta kernel (abs has none).
at::Tensor tiles_amax(const at::Tensor& tiles) {
  return at::linalg_vector_norm(tiles, INFINITY, at::IntArrayRef{2, 4}, false);
}

// A grid [E, Gr, Gc] as x's: without the E of a matrix.
at::Tensor like_x(const at::Tensor& grid, const at::Tensor& x) { return x.dim() == 2 ? grid.squeeze(0) : grid; }

}  // namespace

double fp8_max(at::ScalarType fp8_dtype) {
  if (fp8_dtype == at::kFloat8_e4m3fn) return 448.0;
  if (fp8_dtype == at::kFloat8_e5m2) return 57344.0;
  MT_ASSERT(false, "fp8_max: ", fp8_dtype, " is not float8_e4m3fn or float8_e5m2");
  return 0;
}

const char* fp8_granularity_name(Fp8Granularity g) {
  switch (g) {
    case Fp8Granularity::kTensor: return "tensorwise";
    case Fp8Granularity::kRow: return "rowwise";
    case Fp8Granularity::kTile: return "1x128 tiles";
    case Fp8Granularity::kBlock: return "128x128 blocks";
  }
  return "?";
}

std::array<int64_t, 2> fp8_tile(Fp8Granularity g, int64_t rows, int64_t cols) {
  switch (g) {
    case Fp8Granularity::kTensor: return {std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1)};
    case Fp8Granularity::kRow: return {1, std::max<int64_t>(cols, 1)};
    case Fp8Granularity::kTile: return {1, kFp8BlockSize};
    case Fp8Granularity::kBlock: return {kFp8BlockSize, kFp8BlockSize};
  }
  return {1, 1};
}

std::array<int64_t, 2> fp8_scale_grid(Fp8Granularity g, int64_t rows, int64_t cols) {
  if (g == Fp8Granularity::kTensor) return {1, 1};
  const auto tile = fp8_tile(g, rows, cols);
  return {ceil_div(rows, tile[0]), g == Fp8Granularity::kRow ? 1 : ceil_div(cols, tile[1])};
}

at::Tensor fp8_saturated_cast(const at::Tensor& x, at::ScalarType fp8_dtype) {
  const double max = fp8_max(fp8_dtype);
  return x.clamp(-max, max).to(fp8_dtype);
}

at::Tensor fp8_amax(const at::Tensor& x, Fp8Granularity g) { return like_x(tiles_amax(as_tiles(x, g)), x); }

at::Tensor Fp8Tensor::dequantize() const { return data.to(at::kFloat) * stretch_grid(*this); }

Fp8Tensor Fp8Tensor::transposed() const {
  MT_ASSERT(granularity == Fp8Granularity::kTensor || granularity == Fp8Granularity::kBlock,
            "Fp8Tensor::transposed: ", fp8_granularity_name(granularity),
            " scales run along the reduction dim; quantize the transposed operand instead");
  return {data.transpose(-2, -1), scale.transpose(-2, -1), granularity};
}

const char* fp8_scaled_mm_declines(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype) {
  (void)out_dtype;  // every float out dtype is taken where the scaling is
  const auto& dev = a.data.device();
  if (dev.is_meta()) return "no meta kernel for _scaled_mm";
  if (a.data.numel() == 0 || b.data.numel() == 0) return "an empty operand";
  if (a.data.dim() == 3) return "batched operands (_scaled_grouped_mm not yet measured)";
  if (a.granularity != Fp8Granularity::kTensor || b.granularity != Fp8Granularity::kTensor) {
    return dev.is_cpu() ? "CPU _scaled_mm takes per-tensor scales only"
                        : "rowwise and blockwise _scaled_mm not yet measured on a GPU";
  }
  if (dev.is_cpu()) return nullptr;
  if (!dev.is_cuda()) return "_scaled_mm not measured on this device";
  if (a.data.size(1) % 16 != 0 || b.data.size(0) % 16 != 0) return "K or N not a multiple of 16";
  if (a.data.scalar_type() == at::kFloat8_e5m2 && b.data.scalar_type() == at::kFloat8_e5m2) return "e5m2 x e5m2";
  if (a.data.stride(1) != 1 || b.data.stride(1) != 1) return "an operand not row-major";
  return nullptr;
}

at::Tensor fp8_mm_emulated(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype) {
  const int64_t k = a.data.size(-1);
  const bool whole_rows = (a.granularity == Fp8Granularity::kTensor || a.granularity == Fp8Granularity::kRow) &&
                          (b.granularity == Fp8Granularity::kTensor || b.granularity == Fp8Granularity::kRow);
  const int64_t width = whole_rows ? std::max<int64_t>(k, 1) : kFp8BlockSize;
  // fp8 -> fp32 is exact, and so is each product of two fp8 values in fp32.
  const at::Tensor qa = a.data.to(at::kFloat), qb = b.data.to(at::kFloat);
  std::vector<int64_t> shape = a.data.sizes().vec();
  shape.back() = b.data.size(-2);
  at::Tensor y = at::zeros(shape, qa.options());
  for (int64_t c = 0; c * width < k; ++c) {
    const int64_t k0 = c * width, w = std::min(width, k - k0);
    at::Tensor part = at::matmul(qa.narrow(-1, k0, w), qb.narrow(-1, k0, w).transpose(-2, -1));
    y.add_(part.mul_(chunk_scales(a, c)).mul_(chunk_scales(b, c).transpose(-2, -1)));
  }
  return y.to(out_dtype);
}

namespace {

Fp8Tensor quantize_impl(const at::Tensor& x, at::ScalarType fp8_dtype, Fp8Granularity g, const at::Tensor& given) {
  MT_ASSERT(is_fp8(fp8_dtype), "quantize_fp8: ", fp8_dtype, " is not float8_e4m3fn or float8_e5m2");
  const at::Tensor tiles = as_tiles(x, g);  // checks x
  const int64_t rows = x.size(-2), cols = x.size(-1);
  const std::vector<int64_t> grid{tiles.size(0), tiles.size(1), tiles.size(3)};
  MT_ASSERT(!given.defined() || (given.numel() == grid[0] * grid[1] * grid[2] && given.scalar_type() == at::kFloat),
            "quantize_fp8: amax ", given.sizes(), " ", given.scalar_type(), " for an fp32 grid of ", grid[1], " x ",
            grid[2], " tiles (", fp8_granularity_name(g), " scaling over ", x.sizes(), ")");
  const at::Tensor amax = given.defined() ? given.reshape(grid) : tiles_amax(tiles);
  // s = fp8_max / amax in fp32 (one rounding, as torchao), inv = 1 / s.
  const at::Tensor s = at::full_like(amax, fp8_max(fp8_dtype)).div_(amax.clamp_min(kFp8AmaxFloor));
  Fp8Tensor out{at::Tensor(), like_x(s.reciprocal(), x), g};
  if (x.numel() == 0) {
    out.data = at::empty(x.sizes(), x.options().dtype(fp8_dtype));
    return out;
  }
  const at::Tensor scaled = tiles * s.view({s.size(0), s.size(1), 1, s.size(2), 1});
  at::Tensor data = fp8_saturated_cast(scaled, fp8_dtype).view({s.size(0), tiles.size(1) * tiles.size(2), -1});
  if (data.size(1) != rows || data.size(2) != cols) data = data.narrow(1, 0, rows).narrow(2, 0, cols).contiguous();
  out.data = data.view(x.sizes());
  return out;
}

at::Tensor mm_impl(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype) {
  check_operand(a, "a");
  check_operand(b, "b");
  MT_ASSERT(a.data.dim() == b.data.dim() && a.data.size(-1) == b.data.size(-1) &&
                (a.data.dim() == 2 || a.data.size(0) == b.data.size(0)) && a.data.device() == b.data.device(),
            "fp8_mm: a ", a.data.sizes(), " on ", a.data.device(), " and b ", b.data.sizes(), " on ",
            b.data.device(), " do not make a b^T");
  MT_ASSERT(is_float(out_dtype), "fp8_mm: out dtype ", out_dtype, " is not fp32, bf16 or fp16");
  const char* why_not = fp8_scaled_mm_declines(a, b, out_dtype);
  note_path("fp8_mm", why_not == nullptr, why_not ? why_not : "_scaled_mm");
  if (why_not) return fp8_mm_emulated(a, b, out_dtype);
  return at::_scaled_mm(a.data, b.data.t(), a.scale.reshape({}), b.scale.reshape({}), {}, {}, out_dtype);
}

// meshtrain::fp8_quantize's kernel, the same aten math on every device.
std::tuple<at::Tensor, at::Tensor> quantize_kernel(const at::Tensor& x, at::ScalarType fp8_dtype, int64_t granularity,
                                                   const std::optional<at::Tensor>& amax) {
  const Fp8Tensor q = quantize_impl(x, fp8_dtype, static_cast<Fp8Granularity>(granularity), amax ? *amax : at::Tensor());
  return {q.data, q.scale};
}

at::Tensor mm_kernel(const at::Tensor& a, const at::Tensor& a_scale, int64_t a_granularity, const at::Tensor& b,
                     const at::Tensor& b_scale, int64_t b_granularity, at::ScalarType out_dtype) {
  return mm_impl({a, a_scale, static_cast<Fp8Granularity>(a_granularity)},
                 {b, b_scale, static_cast<Fp8Granularity>(b_granularity)}, out_dtype);
}

}  // namespace

// Registered operators, so that one quantization and one FP8 GEMM are one
// operator each to whoever observes the dispatcher (`bench --device meta`
// counts a quantization's bytes and prices the GEMM at the FP8 peak,
// perf/op_observer.h), whatever aten math computes them here.
TORCH_LIBRARY_FRAGMENT(meshtrain, m) {
  m.def("fp8_quantize(Tensor x, ScalarType dtype, int granularity, Tensor? amax) -> (Tensor, Tensor)");
  m.def("fp8_mm(Tensor a, Tensor a_scale, int a_granularity, Tensor b, Tensor b_scale, int b_granularity, "
        "ScalarType out_dtype) -> Tensor");
}
TORCH_LIBRARY_IMPL(meshtrain, CompositeExplicitAutograd, m) {
  m.impl("fp8_quantize", TORCH_FN(quantize_kernel));
  m.impl("fp8_mm", TORCH_FN(mm_kernel));
}

Fp8Tensor quantize_fp8(const at::Tensor& x, at::ScalarType fp8_dtype, Fp8Granularity g) {
  return quantize_fp8(x, fp8_dtype, g, {});
}

Fp8Tensor quantize_fp8(const at::Tensor& x, at::ScalarType fp8_dtype, Fp8Granularity g, const at::Tensor& amax) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("meshtrain::fp8_quantize", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, at::ScalarType, int64_t,
                                                    const std::optional<at::Tensor>&)>();
  auto [data, scale] = op.call(x, fp8_dtype, static_cast<int64_t>(g),
                               amax.defined() ? std::optional<at::Tensor>(amax) : std::nullopt);
  return {data, scale, g};
}

at::Tensor fp8_mm(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::fp8_mm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&,
                                               const at::Tensor&, int64_t, at::ScalarType)>();
  return op.call(a.data, a.scale, static_cast<int64_t>(a.granularity), b.data, b.scale,
                 static_cast<int64_t>(b.granularity), out_dtype);
}

}  // namespace meshtrain::ops
