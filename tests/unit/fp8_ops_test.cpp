// FP8 quantization and GEMM (ops/fp8.h) against references written here:
// the two formats decoded and rounded from their definitions (exponent bias,
// subnormals, NaN / inf, round to nearest even), the scale tiles' amax by
// loops, every quantized bit against the definition of the scaling, the
// quantization error within the format's precision, and the GEMM of each
// recipe against the fp64 product of the dequantized operands within the
// fp32 summation bound, at::_scaled_mm (CPU, tensorwise) included.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/ops/fp8.h"
#include "seeded_randn.h"

namespace meshtrain {
namespace {

using ops::Fp8Granularity;
using ops::Fp8Tensor;

// ---- the formats, from their definitions ----------------------------------

struct Format {
  at::ScalarType dtype;
  const char* name;
  int man;       // mantissa bits
  int bias;      // exponent bias
  bool fn;       // e4m3fn: no infinities, only S.1111.111 is NaN; else IEEE-like
  double max;    // largest finite value
  uint8_t last;  // bits of max
  uint8_t over;  // the pattern past max: NaN (e4m3fn) or inf (e5m2)
};
const Format kE4M3{at::kFloat8_e4m3fn, "e4m3fn", 3, 7, true, 448.0, 0x7e, 0x7f};
const Format kE5M2{at::kFloat8_e5m2, "e5m2", 2, 15, false, 57344.0, 0x7b, 0x7c};
const Format kFormats[] = {kE4M3, kE5M2};

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The magnitude of pattern `bits` (sign ignored) as if its exponent field
// were an ordinary one: the next step past max for `over`.
double magnitude(const Format& f, uint8_t bits) {
  const int e = (bits & 0x7f) >> f.man, m = bits & ((1 << f.man) - 1);
  if (e == 0) return std::ldexp(m, 1 - f.bias - f.man);  // subnormal: 0.m x 2^(1 - bias)
  return std::ldexp((1 << f.man) + m, e - f.bias - f.man);  // normal: 1.m x 2^(e - bias)
}

double decode(const Format& f, uint8_t bits) {
  const int e = (bits & 0x7f) >> f.man, m = bits & ((1 << f.man) - 1);
  const int e_all = (1 << (7 - f.man)) - 1;
  double v;
  if (f.fn && e == e_all && m == (1 << f.man) - 1) v = kNaN;
  else if (!f.fn && e == e_all) v = m == 0 ? kInf : kNaN;
  else v = magnitude(f, bits);
  return (bits & 0x80) ? -v : v;
}

// x rounded to the nearest pattern, ties to the even one (pattern LSB 0).
// Past max it rounds towards `over` (NaN or inf) as if that were the next
// value; with `saturate`, to max instead.
uint8_t encode(const Format& f, double x, bool saturate = false) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | (f.fn ? 0x7f : 0x7e);
  const double a = std::fabs(x);
  if (saturate && a >= f.max) return sign | f.last;
  if (a >= magnitude(f, f.over)) return sign | f.over;
  uint8_t lo = 0;
  while (lo < f.over && magnitude(f, lo + 1) <= a) ++lo;
  if (magnitude(f, lo) == a) return sign | lo;
  const uint8_t hi = lo + 1;
  // 2a and lo + hi are exact in double: compare them, not two differences.
  const double twice = 2 * a, mid = magnitude(f, lo) + magnitude(f, hi);
  const uint8_t pick = twice < mid ? lo : twice > mid ? hi : ((lo & 1) ? hi : lo);
  if (saturate && pick == f.over) return sign | f.last;
  return sign | pick;
}

std::vector<uint8_t> bits_of(const at::Tensor& fp8) {
  const at::Tensor b = fp8.contiguous().view(at::kByte);
  return std::vector<uint8_t>(b.data_ptr<uint8_t>(), b.data_ptr<uint8_t>() + b.numel());
}

at::Tensor from_doubles(const std::vector<double>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(at::kFloat);
}

TEST(Fp8Format, DecodesEveryPatternAsItsDefinition) {
  for (const Format& f : kFormats) {
    std::vector<uint8_t> all(256);
    for (int i = 0; i < 256; ++i) all[i] = static_cast<uint8_t>(i);
    const at::Tensor raw = at::tensor(std::vector<int64_t>(all.begin(), all.end())).to(at::kByte);
    const at::Tensor vals = raw.view(f.dtype).to(at::kDouble);
    int nans = 0;
    for (int i = 0; i < 256; ++i) {
      const double want = decode(f, all[i]), got = vals[i].item<double>();
      nans += std::isnan(want);
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << f.name << " bits " << i;
      else EXPECT_EQ(got, want) << f.name << " bits " << i;
    }
    EXPECT_EQ(nans, f.fn ? 2 : 6) << f.name;
    EXPECT_EQ(decode(f, f.last), f.max) << f.name;
    EXPECT_EQ(ops::fp8_max(f.dtype), f.max) << f.name;
    EXPECT_EQ(decode(f, 1), f.fn ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16)) << f.name << ": smallest subnormal";
  }
  EXPECT_EQ(decode(kE5M2, 0x7c), kInf);
  EXPECT_EQ(decode(kE5M2, 0xfc), -kInf);
  EXPECT_EQ(decode(kE4M3, 0x08), std::ldexp(1.0, -6)) << "smallest e4m3 normal";
}

// Every bf16 value, the midpoints of neighbouring patterns and their fp32
// neighbours, and random fp32 bit patterns: the rounding cases that matter.
std::vector<float> rounding_cases(const Format& f) {
  std::vector<float> xs;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t w = b << 16;
    float x;
    std::memcpy(&x, &w, 4);
    xs.push_back(x);
  }
  for (uint8_t lo = 0; lo < f.over; ++lo) {
    const float mid = static_cast<float>((magnitude(f, lo) + magnitude(f, lo + 1)) / 2);
    for (const float m : {mid, -mid}) {
      xs.push_back(m);
      xs.push_back(std::nextafter(m, 0.0f));
      xs.push_back(std::nextafter(m, m * 2));
    }
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(49);
  const at::Tensor r = at::randint(0, int64_t{1} << 32, {200000}, gen, at::TensorOptions().dtype(at::kLong));
  for (int64_t i = 0; i < r.numel(); ++i) {
    const uint32_t w = static_cast<uint32_t>(r[i].item<int64_t>());
    float x;
    std::memcpy(&x, &w, 4);
    xs.push_back(x);
  }
  return xs;
}

TEST(Fp8Format, CastRoundsToNearestEvenAsTheDefinition) {
  for (const Format& f : kFormats) {
    const std::vector<float> xs = rounding_cases(f);
    const at::Tensor x = at::tensor(xs);
    const std::vector<uint8_t> plain = bits_of(x.to(f.dtype)), sat = bits_of(ops::fp8_saturated_cast(x, f.dtype));
    int64_t bad_plain = 0, bad_sat = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      for (const bool s : {false, true}) {
        const uint8_t want = encode(f, xs[i], s), got = s ? sat[i] : plain[i];
        const bool ok = std::isnan(decode(f, want)) ? std::isnan(decode(f, got)) : got == want;
        if (!ok && (s ? bad_sat : bad_plain)++ < 5) {
          ADD_FAILURE() << f.name << (s ? " saturated" : " plain") << " cast of " << xs[i] << ": bits " << int(got)
                        << ", the definition " << int(want);
        }
      }
    }
    EXPECT_EQ(bad_plain, 0) << f.name;
    EXPECT_EQ(bad_sat, 0) << f.name;
  }
}

TEST(Fp8Format, SaturatingCastClampsWhatThePlainCastLoses) {
  for (const Format& f : kFormats) {
    const double big = f.max * 1.5;
    const at::Tensor x = from_doubles({big, -big, kInf, -kInf, kNaN, f.max, -f.max, 1.0});
    const at::Tensor plain = x.to(f.dtype).to(at::kDouble), sat = ops::fp8_saturated_cast(x, f.dtype).to(at::kDouble);
    // aten's cast: NaN (e4m3fn has no inf) or inf past the range.
    if (f.fn) EXPECT_TRUE(std::isnan(plain[0].item<double>())) << f.name;
    else EXPECT_EQ(plain[0].item<double>(), kInf) << f.name;
    const std::vector<double> want{f.max, -f.max, f.max, -f.max, kNaN, f.max, -f.max, 1.0};
    for (size_t i = 0; i < want.size(); ++i) {
      const double got = sat[i].item<double>();
      if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(got)) << f.name << " " << i;
      else EXPECT_EQ(got, want[i]) << f.name << " element " << i;
    }
  }
}

// ---- scales per tensor, row, tile and block --------------------------------

using test_util::randn;

// rows x cols with rows of very different magnitudes (2^0 .. 2^-(span-1))
// and columns too, as activations with outlier channels have.
at::Tensor skewed(int64_t rows, int64_t cols, uint64_t seed, int span = 12) {
  const at::Tensor r = at::pow(2.0, -(at::arange(rows, at::kFloat).remainder(span))).unsqueeze(1);
  const at::Tensor c = at::pow(2.0, -(at::arange(cols, at::kFloat).remainder(5))).unsqueeze(0);
  return randn({rows, cols}, seed) * r * c;
}

const Fp8Granularity kGranularities[] = {Fp8Granularity::kTensor, Fp8Granularity::kRow, Fp8Granularity::kTile,
                                         Fp8Granularity::kBlock};

struct Tile {
  int64_t rows, cols;
};
Tile tile_of(Fp8Granularity g, int64_t rows, int64_t cols) {
  switch (g) {
    case Fp8Granularity::kTensor: return {rows, cols};
    case Fp8Granularity::kRow: return {1, cols};
    case Fp8Granularity::kTile: return {1, 128};
    case Fp8Granularity::kBlock: return {128, 128};
  }
  return {0, 0};
}

// max |x| per tile by loops.
std::vector<std::vector<float>> amax_by_loops(const at::Tensor& x, Tile t) {
  const auto a = x.accessor<float, 2>();
  const int64_t rows = x.size(0), cols = x.size(1);
  std::vector<std::vector<float>> m((rows + t.rows - 1) / t.rows, std::vector<float>((cols + t.cols - 1) / t.cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float& v = m[i / t.rows][j / t.cols];
      v = std::max(v, std::fabs(a[i][j]));
    }
  return m;
}

TEST(Fp8Scales, AmaxPerTileWithPartialTilesAndZeroBlocks) {
  // 300 = 2 x 128 + 44 rows, 200 = 128 + 72 columns: partial tiles both ways.
  at::Tensor x = skewed(300, 200, 1);
  x.narrow(0, 128, 128).narrow(1, 128, 72).zero_();  // block (1, 1) and its 1x128 tiles all zero
  for (const Fp8Granularity g : kGranularities) {
    const std::string what = ops::fp8_granularity_name(g);
    const Tile t = tile_of(g, 300, 200);
    const auto want = amax_by_loops(x, t);
    const at::Tensor amax = ops::fp8_amax(x, g);
    const auto grid = ops::fp8_scale_grid(g, 300, 200);
    ASSERT_EQ(amax.scalar_type(), at::kFloat) << what;
    ASSERT_EQ(amax.sizes(), (std::vector<int64_t>{grid[0], grid[1]})) << what;
    ASSERT_EQ(amax.size(0), static_cast<int64_t>(want.size())) << what;
    ASSERT_EQ(amax.size(1), static_cast<int64_t>(want[0].size())) << what;
    for (int64_t i = 0; i < amax.size(0); ++i)
      for (int64_t j = 0; j < amax.size(1); ++j) EXPECT_EQ(amax[i][j].item<float>(), want[i][j]) << what << " " << i;
  }
  EXPECT_EQ(ops::fp8_scale_grid(Fp8Granularity::kTile, 300, 200), (std::array<int64_t, 2>{300, 2}));
  EXPECT_EQ(ops::fp8_scale_grid(Fp8Granularity::kBlock, 300, 200), (std::array<int64_t, 2>{3, 2}));
  EXPECT_EQ(ops::fp8_scale_grid(Fp8Granularity::kBlock, 256, 128), (std::array<int64_t, 2>{2, 1}));
  EXPECT_EQ(ops::fp8_scale_grid(Fp8Granularity::kRow, 300, 200), (std::array<int64_t, 2>{300, 1}));
  EXPECT_EQ(ops::fp8_amax(x, Fp8Granularity::kBlock)[1][1].item<float>(), 0.0f);
}

// Each quantized bit and inverse scale as the scaling's definition gives
// them: s = fp8_max / max(amax, floor) in fp32, q = the saturating cast of
// the fp32 product x s, inv = 1 / s in fp32.
void expect_quantized_as_defined(const at::Tensor& x, const Format& f, Fp8Granularity g) {
  const std::string what = std::string(f.name) + " " + ops::fp8_granularity_name(g);
  const Fp8Tensor q = ops::quantize_fp8(x, f.dtype, g);
  const int64_t rows = x.size(0), cols = x.size(1);
  ASSERT_EQ(q.data.scalar_type(), f.dtype) << what;
  ASSERT_EQ(q.data.sizes(), x.sizes()) << what;
  const Tile t = tile_of(g, rows, cols);
  const at::Tensor xc = x.contiguous();
  const auto amax = amax_by_loops(xc, t);
  const auto xa = xc.accessor<float, 2>();
  const std::vector<uint8_t> bits = bits_of(q.data);
  int64_t bad = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float m = std::max(amax[i / t.rows][j / t.cols], static_cast<float>(ops::kFp8AmaxFloor));
      const float s = static_cast<float>(f.max) / m;
      const uint8_t want = encode(f, xa[i][j] * s, true);
      if (bits[i * cols + j] != want && bad++ < 5) ADD_FAILURE() << what << " (" << i << ", " << j << ")";
      if (j % t.cols == 0 && i % t.rows == 0) {
        ASSERT_EQ(q.scale[i / t.rows][j / t.cols].item<float>(), 1.0f / s) << what << " scale of " << i << ", " << j;
      }
    }
  EXPECT_EQ(bad, 0) << what;
}

TEST(Fp8Scales, QuantizedBitsAndScalesAsDefined) {
  at::Tensor x = skewed(300, 200, 2);
  x.narrow(0, 128, 128).narrow(1, 128, 72).zero_();
  for (const Format& f : kFormats)
    for (const Fp8Granularity g : kGranularities) expect_quantized_as_defined(x, f, g);
  // A transposed (non-contiguous) operand: a weight quantized for dW.
  expect_quantized_as_defined(skewed(200, 130, 3).t(), kE4M3, Fp8Granularity::kTile);
  // All-zero tiles: zeros with the floor's finite scale.
  const Fp8Tensor z = ops::quantize_fp8(at::zeros({3, 130}), at::kFloat8_e4m3fn, Fp8Granularity::kTile);
  EXPECT_EQ(z.dequantize().abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(z.scale.isfinite().all().item<bool>());
  EXPECT_GT(z.scale.min().item<float>(), 0.0f);
}

// Each element's inverse scale (its tile's), fp32 [R, K].
at::Tensor element_scales(const Fp8Tensor& q) {
  return Fp8Tensor{at::ones(q.data.sizes()).to(q.data.scalar_type()), q.scale, q.granularity}.dequantize();
}

// |x - q inv| <= 2^-(man+1) |x| (half an ulp) + half the smallest
// subnormal times inv (the subnormal range), inv the element's tile's
// scale. Where x s is a normal value the relative error is at most
// u / (1 + u), u = 2^-(man+1) (the worst case: just past a binade's first
// midpoint), and random data comes close to it: the format's precision,
// not a finer one.
TEST(Fp8Scales, QuantizationErrorWithinTheFormatsPrecision) {
  const at::Tensor x = skewed(260, 300, 4, 20);
  const at::Tensor xd = x.to(at::kDouble);
  // Slack for the fp32 roundings of x s, 1 / s and q inv: a few 2^-24 of |x|.
  const double fp32_slack = std::ldexp(1.0, -21);
  for (const Format& f : kFormats)
    for (const Fp8Granularity g : kGranularities) {
      const std::string what = std::string(f.name) + " " + ops::fp8_granularity_name(g);
      const Fp8Tensor q = ops::quantize_fp8(x, f.dtype, g);
      const at::Tensor inv = element_scales(q).to(at::kDouble);
      const double u = std::ldexp(1.0, -(f.man + 1)), sub = magnitude(f, 1) / 2;
      const at::Tensor err = (q.dequantize().to(at::kDouble) - xd).abs();
      const at::Tensor bound = xd.abs() * (u + fp32_slack) + inv * sub * 1.0001;
      EXPECT_TRUE((err <= bound).all().item<bool>()) << what << ": worst " << (err / bound).max().item<double>();
      const at::Tensor normal = xd.abs() >= inv * magnitude(f, 1 << f.man);  // x s >= the smallest normal
      const double worst = (err / xd.abs()).masked_select(normal).max().item<double>();
      EXPECT_GT(worst, 0.95 * u / (1 + u)) << what;
      EXPECT_LE(worst, u / (1 + u) + fp32_slack) << what;
      std::printf("%-6s %-14s max |x - q inv| / |x| over normals: %.4f (bound %.4f)\n", f.name,
                  ops::fp8_granularity_name(g), worst, u / (1 + u));
    }
}

// ---- the GEMM ---------------------------------------------------------------

// The fp64 product of the dequantized operands (exact: fp8 x fp32 scale has
// at most 28 significant bits) and the fp32 summation bound around it,
// (K + 4) 2^-24 (|A| |B|^T): K sums, the two scale products, the chunks' sum.
struct Reference {
  at::Tensor y, bound;
};
Reference reference(const Fp8Tensor& a, const Fp8Tensor& b) {
  const at::Tensor da = a.data.to(at::kDouble) * element_scales(a).to(at::kDouble);
  const at::Tensor db = b.data.to(at::kDouble) * element_scales(b).to(at::kDouble);
  const double gamma = (a.data.size(1) + 4) * std::ldexp(1.0, -24);
  return {at::mm(da, db.t()), at::mm(da.abs(), db.abs().t()) * gamma};
}

// max |y - ref| / max |ref| after checking |y - ref| <= bound elementwise.
double expect_within(const at::Tensor& y, const Reference& r, const std::string& what) {
  const at::Tensor err = (y.to(at::kDouble) - r.y).abs();
  EXPECT_TRUE((err <= r.bound).all().item<bool>())
      << what << ": worst error / bound " << (err / r.bound.clamp_min(1e-300)).max().item<double>();
  return err.max().item<double>() / r.y.abs().max().item<double>();
}

struct Recipe {
  const char* name;
  at::ScalarType a_dtype, b_dtype;
  Fp8Granularity a_g, b_g;
};
const Recipe kRecipes[] = {
    {"tensorwise", at::kFloat8_e4m3fn, at::kFloat8_e4m3fn, Fp8Granularity::kTensor, Fp8Granularity::kTensor},
    {"tensorwise gradient (e5m2 x e4m3)", at::kFloat8_e5m2, at::kFloat8_e4m3fn, Fp8Granularity::kTensor,
     Fp8Granularity::kTensor},
    {"rowwise", at::kFloat8_e4m3fn, at::kFloat8_e4m3fn, Fp8Granularity::kRow, Fp8Granularity::kRow},
    {"blockwise (1x128 x 128x128)", at::kFloat8_e4m3fn, at::kFloat8_e4m3fn, Fp8Granularity::kTile,
     Fp8Granularity::kBlock},
    {"blockwise (1x128 x 1x128)", at::kFloat8_e4m3fn, at::kFloat8_e4m3fn, Fp8Granularity::kTile,
     Fp8Granularity::kTile},
};

TEST(Fp8Gemm, EachRecipeIsTheDequantizedProductToFp32Summation) {
  // M 70, K 300 (two whole 128-chunks and a partial one), N 200.
  const at::Tensor x = skewed(70, 300, 5), w = randn({200, 300}, 6) * 0.05;
  const at::Tensor exact = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
  for (const Recipe& r : kRecipes) {
    const Fp8Tensor a = ops::quantize_fp8(x, r.a_dtype, r.a_g), b = ops::quantize_fp8(w, r.b_dtype, r.b_g);
    const Reference ref = reference(a, b);
    const at::Tensor y = ops::fp8_mm(a, b, at::kFloat), y_em = ops::fp8_mm_emulated(a, b, at::kFloat);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{70, 200})) << r.name;
    ASSERT_EQ(y.scalar_type(), at::kFloat) << r.name;
    const double e = expect_within(y, ref, r.name), e_em = expect_within(y_em, ref, std::string(r.name) + " emulated");
    // FP8 really in use: the product of the quantized operands is off the
    // unquantized one by far more than bf16 would be, within e4m3/e5m2's precision.
    const double q_err = ((y.to(at::kDouble) - exact).norm() / exact.norm()).item<double>();
    EXPECT_GT(q_err, std::ldexp(1.0, -8)) << r.name;
    EXPECT_LT(q_err, std::ldexp(1.0, -3)) << r.name;
    std::printf("%-36s max |y - fp64| / max |y|: %.3g (emulated %.3g); vs unquantized product %.4f\n", r.name, e,
                e_em, q_err);
  }
}

TEST(Fp8Gemm, BackwardOperandsAndTransposedBlocks) {
  // dX = dY W: dY [M, N] in 1x128 tiles along N, W [N, K] as the forward's
  // 128x128 blocks transposed; dW = dY^T X: both along the tokens.
  const at::Tensor dy = skewed(70, 200, 7), w = randn({200, 300}, 8), x = randn({70, 300}, 9);
  const Fp8Tensor wq = ops::quantize_fp8(w, at::kFloat8_e4m3fn, Fp8Granularity::kBlock);
  const Fp8Tensor dyq = ops::quantize_fp8(dy, at::kFloat8_e4m3fn, Fp8Granularity::kTile);
  const at::Tensor dx = ops::fp8_mm(dyq, wq.transposed(), at::kFloat);
  ASSERT_EQ(dx.sizes(), (std::vector<int64_t>{70, 300}));
  expect_within(dx, reference(dyq, wq.transposed()), "dX = dY W (W's blocks transposed)");
  EXPECT_TRUE(at::equal(wq.transposed().dequantize(), wq.dequantize().t()));
  const Fp8Tensor dyt = ops::quantize_fp8(dy.t(), at::kFloat8_e4m3fn, Fp8Granularity::kTile);
  const Fp8Tensor xt = ops::quantize_fp8(x.t(), at::kFloat8_e4m3fn, Fp8Granularity::kTile);
  const at::Tensor dw = ops::fp8_mm(dyt, xt, at::kFloat);
  ASSERT_EQ(dw.sizes(), (std::vector<int64_t>{200, 300}));
  expect_within(dw, reference(dyt, xt), "dW = dY^T X");
  EXPECT_THROW(ops::quantize_fp8(x, at::kFloat8_e4m3fn, Fp8Granularity::kRow).transposed(), std::exception);
  EXPECT_THROW(dyq.transposed(), std::exception);
}

TEST(Fp8Gemm, BatchedOperandsAreEachMatrixOnItsOwn) {
  // Three experts' GEMMs, the second's activations 2^-10 of the others'.
  const at::Tensor x = randn({3, 40, 300}, 17) * at::tensor({1.0f, 1.0f / 1024, 8.0f}).view({3, 1, 1});
  const at::Tensor w = randn({3, 200, 300}, 18), dy = randn({3, 40, 200}, 19);
  const std::pair<Fp8Granularity, Fp8Granularity> recipes[] = {{Fp8Granularity::kTensor, Fp8Granularity::kTensor},
                                                               {Fp8Granularity::kRow, Fp8Granularity::kRow},
                                                               {Fp8Granularity::kTile, Fp8Granularity::kBlock}};
  for (const auto& [ag, bg] : recipes) {
    const std::string what = std::string("batched ") + ops::fp8_granularity_name(ag);
    const Fp8Tensor a = ops::quantize_fp8(x, at::kFloat8_e4m3fn, ag), b = ops::quantize_fp8(w, at::kFloat8_e4m3fn, bg);
    const auto grid = ops::fp8_scale_grid(ag, 40, 300);
    ASSERT_EQ(a.scale.sizes(), (std::vector<int64_t>{3, grid[0], grid[1]})) << what;
    EXPECT_NE(ops::fp8_scaled_mm_declines(a, b, at::kFloat), nullptr) << what;
    const at::Tensor y = ops::fp8_mm(a, b, at::kFloat);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 40, 200})) << what;
    for (int64_t e = 0; e < 3; ++e) {
      const Fp8Tensor ae = ops::quantize_fp8(x[e], at::kFloat8_e4m3fn, ag);
      const Fp8Tensor be = ops::quantize_fp8(w[e], at::kFloat8_e4m3fn, bg);
      EXPECT_TRUE(at::equal(a.data[e].view(at::kByte), ae.data.view(at::kByte))) << what << " expert " << e;
      EXPECT_TRUE(at::equal(a.scale[e], ae.scale)) << what << " expert " << e;
      expect_within(y[e], reference(ae, be), what + " expert " + std::to_string(e));
    }
    if (bg != Fp8Granularity::kBlock) continue;
    // dX = dY W per expert, W's blocks transposed.
    const Fp8Tensor dyq = ops::quantize_fp8(dy, at::kFloat8_e4m3fn, Fp8Granularity::kTile);
    const at::Tensor dx = ops::fp8_mm(dyq, b.transposed(), at::kFloat);
    ASSERT_EQ(dx.sizes(), (std::vector<int64_t>{3, 40, 300}));
    for (int64_t e = 0; e < 3; ++e) {
      const Fp8Tensor dye = ops::quantize_fp8(dy[e], at::kFloat8_e4m3fn, Fp8Granularity::kTile);
      const Fp8Tensor we = ops::quantize_fp8(w[e], at::kFloat8_e4m3fn, Fp8Granularity::kBlock);
      expect_within(dx[e], reference(dye, we.transposed()), "batched dX expert " + std::to_string(e));
    }
  }
}

TEST(Fp8Gemm, ScaledMmOnCpuEqualsTheEmulationTensorwise) {
  const at::Tensor x = randn({64, 256}, 10) * 3, w = randn({96, 256}, 11) * 0.02;
  for (const auto& [ad, bd] : {std::pair{at::kFloat8_e4m3fn, at::kFloat8_e4m3fn},
                               std::pair{at::kFloat8_e5m2, at::kFloat8_e4m3fn},
                               std::pair{at::kFloat8_e5m2, at::kFloat8_e5m2}}) {
    const Fp8Tensor a = ops::quantize_fp8(x, ad, Fp8Granularity::kTensor);
    const Fp8Tensor b = ops::quantize_fp8(w, bd, Fp8Granularity::kTensor);
    ASSERT_EQ(ops::fp8_scaled_mm_declines(a, b, at::kFloat), nullptr);
    const at::Tensor sm = at::_scaled_mm(a.data, b.data.t(), a.scale.reshape({}), b.scale.reshape({}), {}, {},
                                         at::kFloat);
    const at::Tensor em = ops::fp8_mm_emulated(a, b, at::kFloat);
    const Reference ref = reference(a, b);
    expect_within(sm, ref, "_scaled_mm");
    expect_within(em, ref, "emulation");
    // Both within the summation bound of each other too.
    EXPECT_TRUE(((sm.to(at::kDouble) - em.to(at::kDouble)).abs() <= 2 * ref.bound).all().item<bool>());
    std::printf("%s x %s: max |_scaled_mm - emulation| = %.3g (max |y| %.3g)\n", c10::toString(ad),
                c10::toString(bd), (sm - em).abs().max().item<double>(), em.abs().max().item<double>());
    // bf16 out: each the fp32 result rounded once.
    const at::Tensor sm16 = ops::fp8_mm(a, b, at::kBFloat16), em16 = ops::fp8_mm_emulated(a, b, at::kBFloat16);
    ASSERT_EQ(sm16.scalar_type(), at::kBFloat16);
    const at::Tensor ulp = ref.y.abs() * std::ldexp(1.0, -8) + 2 * ref.bound;
    EXPECT_TRUE(((sm16.to(at::kDouble) - ref.y).abs() <= ulp).all().item<bool>());
    EXPECT_TRUE(((em16.to(at::kDouble) - ref.y).abs() <= ulp).all().item<bool>());
  }
}

TEST(Fp8Gemm, CpuScaledMmTakesPerTensorScalesOnly) {
  // Why rowwise and blockwise are emulated on the CPU: PyTorch 2.11 refuses
  // them there. If this starts passing scales through, enable them.
  const at::Tensor x = randn({32, 128}, 12), w = randn({16, 128}, 13);
  const Fp8Tensor a = ops::quantize_fp8(x, at::kFloat8_e4m3fn, Fp8Granularity::kRow);
  const Fp8Tensor b = ops::quantize_fp8(w, at::kFloat8_e4m3fn, Fp8Granularity::kRow);
  EXPECT_THROW(at::_scaled_mm(a.data, b.data.t(), a.scale, b.scale.t(), {}, {}, at::kFloat), std::exception);
  EXPECT_STREQ(ops::fp8_scaled_mm_declines(a, b, at::kFloat), "CPU _scaled_mm takes per-tensor scales only");
  const Fp8Tensor bt = ops::quantize_fp8(w, at::kFloat8_e4m3fn, Fp8Granularity::kBlock);
  EXPECT_NE(ops::fp8_scaled_mm_declines(a, bt, at::kFloat), nullptr);
  const Fp8Tensor at_ = ops::quantize_fp8(x, at::kFloat8_e4m3fn, Fp8Granularity::kTensor);
  const Fp8Tensor bt_ = ops::quantize_fp8(w, at::kFloat8_e4m3fn, Fp8Granularity::kTensor);
  EXPECT_EQ(ops::fp8_scaled_mm_declines(at_, bt_, at::kFloat), nullptr);
}

TEST(Fp8Gemm, FinerScalesKeepRowsThatOneScaleLoses) {
  // Rows 2^0 .. 2^-23: one e4m3 scale for the tensor (or a 128x128 block,
  // which holds all 48 rows) flushes the smallest rows to zero (2^-23 of the
  // amax times 448 is below half the smallest subnormal, 2^-10); a scale per
  // row or per 1x128 tile keeps every row within 2^-4.
  const at::Tensor x = skewed(48, 256, 14, 24);
  const at::Tensor smallest = x.narrow(0, 23, 1);
  for (const Fp8Granularity g : kGranularities) {
    const at::Tensor dq = ops::quantize_fp8(x, at::kFloat8_e4m3fn, g).dequantize().narrow(0, 23, 1);
    const double rel = ((dq - smallest).abs().max() / smallest.abs().max()).item<double>();
    if (g == Fp8Granularity::kTensor || g == Fp8Granularity::kBlock) {
      EXPECT_EQ(rel, 1.0) << ops::fp8_granularity_name(g);
    } else {
      EXPECT_LE(rel, 1.0 / 16) << ops::fp8_granularity_name(g);
    }
  }
}

TEST(Fp8Quantize, NonFiniteValuesPoisonOnlyTheirTile) {
  at::Tensor x = randn({4, 300}, 15);
  const Fp8Tensor clean = ops::quantize_fp8(x, at::kFloat8_e4m3fn, Fp8Granularity::kTile);
  x[1][5] = std::nanf("");
  x[2][260] = std::numeric_limits<float>::infinity();
  const at::Tensor dq = ops::quantize_fp8(x, at::kFloat8_e4m3fn, Fp8Granularity::kTile).dequantize();
  EXPECT_TRUE(dq[1].narrow(0, 0, 128).isnan().all().item<bool>()) << "the NaN's tile";
  EXPECT_TRUE(dq[2].narrow(0, 256, 44).isnan().all().item<bool>()) << "the inf's tile";
  at::Tensor mask = at::ones({4, 300}, at::kBool);
  mask[1].narrow(0, 0, 128).fill_(false);
  mask[2].narrow(0, 256, 44).fill_(false);
  EXPECT_TRUE(at::equal(dq.masked_select(mask), clean.dequantize().masked_select(mask))) << "every other tile";
}

TEST(Fp8Quantize, MetaAndEmptyOperands) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  const Fp8Tensor a = ops::quantize_fp8(at::empty({70, 300}, meta.dtype(at::kBFloat16)), at::kFloat8_e4m3fn,
                                        Fp8Granularity::kTile);
  const Fp8Tensor b = ops::quantize_fp8(at::empty({200, 300}, meta), at::kFloat8_e4m3fn, Fp8Granularity::kBlock);
  EXPECT_TRUE(a.data.is_meta());
  EXPECT_EQ(a.data.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(a.scale.sizes(), (std::vector<int64_t>{70, 3}));
  EXPECT_EQ(b.scale.sizes(), (std::vector<int64_t>{2, 3}));
  const at::Tensor y = ops::fp8_mm(a, b, at::kBFloat16);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{70, 200}));
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  // No tokens for an expert: [0, K] operands, and K = 0.
  const Fp8Tensor e = ops::quantize_fp8(at::empty({0, 300}), at::kFloat8_e4m3fn, Fp8Granularity::kTile);
  const Fp8Tensor w = ops::quantize_fp8(randn({200, 300}, 16), at::kFloat8_e4m3fn, Fp8Granularity::kBlock);
  EXPECT_EQ(ops::fp8_mm(e, w, at::kFloat).sizes(), (std::vector<int64_t>{0, 200}));
  const Fp8Tensor k0 = ops::quantize_fp8(at::empty({5, 0}), at::kFloat8_e4m3fn, Fp8Granularity::kTensor);
  const Fp8Tensor k0b = ops::quantize_fp8(at::empty({7, 0}), at::kFloat8_e4m3fn, Fp8Granularity::kTensor);
  EXPECT_TRUE(at::equal(ops::fp8_mm(k0, k0b, at::kFloat), at::zeros({5, 7})));
}

}  // namespace
}  // namespace meshtrain
