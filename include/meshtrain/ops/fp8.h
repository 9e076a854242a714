#pragma once
// FP8 quantization and the FP8 GEMM (issue 49), one program on every device:
// the quantization (amax, scale, saturating cast) is the same aten math on
// CPU, CUDA and meta; the GEMM is at::_scaled_mm where the device takes the
// operands' scaling, else an exact emulation of it.
//
// Formats: float8_e4m3fn (4 exponent bits, bias 7, 3 mantissa bits, no
// infinities, one NaN pattern per sign, max normal 448) for weights and
// activations; float8_e5m2 (IEEE-like, bias 15, 2 mantissa bits, +-inf, max
// normal 57344) for gradients in the tensorwise recipe.
//
// Granularity: an operand is a matrix [R, K] whose K is the GEMM's reduction
// dim, cut into scale tiles of tr x tc elements; each tile has one scale.
//   tensor  tr x tc = R x K    one current scale per tensor (torchtitan "tensorwise")
//   row     1 x K              a scale per row along the reduction (torchtitan "rowwise")
//   tile    1 x 128            DeepSeek-V3's activations and gradients
//   block   128 x 128          DeepSeek-V3's weights
// The last tile of a row or column may be partial (K or R not a multiple of
// 128): its amax is taken over the elements it has. Batched operands
// [E, R, K] (the experts' GEMMs) are E matrices, each with its own tiles
// (kTensor: a scale per matrix) and a scale grid [E, Gr, Gc].
//
// Scales (the convention of at::_scaled_mm and torchao): per tile,
//   amax  = max |x| over the tile, floored at kFp8AmaxFloor (an all-zero
//           tile then quantizes to zeros with a finite scale),
//   s     = fp8_max / amax                (fp32; x * s fills the format)
//   q     = saturate(x * s)               (fp32 product, clamped to +-fp8_max,
//                                          rounded to nearest even)
//   inv   = 1 / s                         (fp32) -- what Fp8Tensor::scale holds,
// and q * inv is the dequantized value: _scaled_mm(a, b^T, inv_a, inv_b)
// computes (q_a inv_a)(q_b inv_b)^T. A NaN or an infinity in a tile makes
// its s NaN or 0 (inv NaN or inf), so the tile dequantizes to NaN (the loss
// shows it, as it would in bf16).
//
// Not differentiable: autograd functions on top of these are the model's
// (model/fp8_linear.h). quantize_fp8 and fp8_mm dispatch as the operators
// meshtrain::fp8_quantize and meshtrain::fp8_mm, one kernel each to
// `bench --device meta` (perf/op_observer.h).
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace meshtrain::ops {

enum class Fp8Granularity { kTensor, kRow, kTile, kBlock };

// The edge of DeepSeek-V3's tiles and blocks.
inline constexpr int64_t kFp8BlockSize = 128;
// amax below this counts as this (torchao's EPS): no division by zero.
inline constexpr double kFp8AmaxFloor = 1e-12;

// The largest finite value of at::kFloat8_e4m3fn (448) or kFloat8_e5m2 (57344).
double fp8_max(at::ScalarType fp8_dtype);
const char* fp8_granularity_name(Fp8Granularity g);

// The scale tile of granularity g over a [rows, cols] operand ({rows, cols}
// for kTensor, {1, cols} for kRow, ...), and the scale grid's shape
// [ceil(rows / tr), ceil(cols / tc)]: [1, 1], [R, 1], [R, ceil(K/128)],
// [ceil(R/128), ceil(K/128)].
std::array<int64_t, 2> fp8_tile(Fp8Granularity g, int64_t rows, int64_t cols);
std::array<int64_t, 2> fp8_scale_grid(Fp8Granularity g, int64_t rows, int64_t cols);

// x (any float dtype) in fp8_dtype, values beyond +-fp8_max clamped to it
// (infinities too; NaN stays NaN). aten's own cast is not saturating: it
// gives NaN (e4m3fn) or inf (e5m2) past the format's range.
at::Tensor fp8_saturated_cast(const at::Tensor& x, at::ScalarType fp8_dtype);

// max |x| per scale tile of x [R, K] or [E, R, K] (fp32, the scale grid's
// shape, with E); NaN in a tile gives NaN.
at::Tensor fp8_amax(const at::Tensor& x, Fp8Granularity g);

// An operand quantized for fp8_mm.
struct Fp8Tensor {
  at::Tensor data;   // [R, K] or [E, R, K], kFloat8_e4m3fn or kFloat8_e5m2
  at::Tensor scale;  // fp32 inverse scales (inv above), fp8_scale_grid's shape (with E)
  Fp8Granularity granularity = Fp8Granularity::kTensor;

  // data * scale, each element by its tile's scale: fp32, data's shape.
  at::Tensor dequantize() const;
  // [.., K, R] with the same scales transposed, for an operand used both ways
  // (a weight in the forward and the input-gradient GEMM); kTensor and
  // kBlock only, whose tiles are symmetric.
  Fp8Tensor transposed() const;
};

// x [R, K] or [E, R, K] (fp32, bf16 or fp16) quantized to fp8_dtype with
// granularity g.
Fp8Tensor quantize_fp8(const at::Tensor& x, at::ScalarType fp8_dtype, Fp8Granularity g);
// The same with the tiles' amax given (fp8_amax's shape): a caller whose x
// is a shard of a larger operand max-reduces fp8_amax(x, g) over the ranks
// holding the rest first, so every rank scales as one process would.
Fp8Tensor quantize_fp8(const at::Tensor& x, at::ScalarType fp8_dtype, Fp8Granularity g, const at::Tensor& amax);

// y = dequant(a) dequant(b)^T in out_dtype (fp32, bf16 or fp16): a [M, K],
// b [N, K] -> [M, N]; or batched, a [E, M, K], b [E, N, K] -> [E, M, N].
// Per reduction chunk (all of K where both operands scale whole rows, else
// 128 columns, which both then tile), the fp8 products are summed in fp32
// (each product is exact there), multiplied by the chunk's scales and added
// in fp32; at::_scaled_mm where fp8_scaled_mm_declines says nothing, else
// that emulated with fp32 GEMMs. The two differ only in the order of the
// fp32 sums.
at::Tensor fp8_mm(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype);
// Why at::_scaled_mm does not take these operands on their device (null:
// it does). CPU: per-tensor scales only (PyTorch 2.11 refuses others
// there); any shape, strides and out dtype. CUDA: per-tensor scales with K
// and N multiples of 16, row-major operands, not both e5m2 (PyTorch's
// checks for cuBLASLt; not yet run on a GPU here); rowwise and blockwise
// scales and batched operands (_scaled_grouped_mm) are emulated until they
// are measured on one. meta: never (no meta kernel; the emulation's GEMMs
// give the shapes).
const char* fp8_scaled_mm_declines(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype);
// The emulation alone (tests compare it with _scaled_mm).
at::Tensor fp8_mm_emulated(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype);

}  // namespace meshtrain::ops
