// The fused operators (ops/fused.h) against plain aten math: CPU kernels (the
// row math the CUDA kernels share), the aten composites a CUDA build without
// nvcc runs, their autograd, and their meta shapes.
#include <gtest/gtest.h>
#include <random>
#include <torch/torch.h>

#include "meshtrain/model/cross_entropy.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/ops/fused.h"
#include "meshtrain/ops/slot_rows.h"
#include "ops/kernels.h"
#include "ops/launch_plan.h"
#include "ops/row_math.h"
#include "ops/strided.h"
#include "seeded_randn.h"

namespace meshtrain {
namespace {

using test_util::randn;

// Rotation in plain aten, positions along seq_dim: x*cos + rotate_half(x)*sin.
at::Tensor aten_rope(const at::Tensor& x, int64_t offset, int64_t seq_dim, double theta) {
  const int64_t dim = x.size(-1), T = x.size(seq_dim);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const auto inv_freq = at::pow(theta, -at::arange(0, dim, 2, f32) / static_cast<double>(dim));
  const auto angle = at::outer(at::arange(offset, offset + T, f32), inv_freq);
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(seq_dim)] = T;
  shape.back() = dim;
  const auto cos = at::cat({angle.cos(), angle.cos()}, -1).reshape(shape);
  const auto sin = at::cat({angle.sin(), angle.sin()}, -1).reshape(shape);
  const auto h = x.chunk(2, -1);
  return x * cos + at::cat({-h[1], h[0]}, -1) * sin;
}

at::Tensor aten_rms_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor y = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * w;
  return b.defined() ? y + b : y;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double err = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  const double scale = b.to(at::kDouble).abs().max().item<double>() + 1e-12;
  EXPECT_LE(err / scale, tol) << what << ": max error " << err << " (scale " << scale << ")";
  EXPECT_FALSE(at::isnan(a).any().item<bool>()) << what;
}

TEST(Ops, RopeMatchesAtenOnAnyLayoutAndOffset) {
  // [B, T, H, D] seq 1; a transposed view [B, H, T, D] seq 2; [T, D] seq 0.
  const at::Tensor base = randn({2, 7, 3, 8}, 1);
  struct Case {
    at::Tensor x;
    int64_t seq;
  };
  for (const Case& c : {Case{base, 1}, Case{base.transpose(1, 2), 2}, Case{base.select(0, 1).select(1, 0), 0}})
    for (int64_t offset : {0, 5}) {
      const auto t = ops::rope_tables(8, 20, 10000.0, at::kCPU);
      const at::Tensor y = ops::rope(c.x, t, offset, c.seq);
      expect_close(y, aten_rope(c.x, offset, c.seq, 10000.0), 1e-6, "rope seq " + std::to_string(c.seq));
      // The composite (CUDA builds without nvcc) computes the same.
      at::Tensor ref = at::empty_like(c.x);
      ops::impl::rope_out_ref(c.x, t.cos, t.sin, offset, c.seq, false, ref);
      expect_close(ref, y, 1e-6, "rope composite");
      // The inverse undoes it.
      at::Tensor back = at::empty_like(y);
      ops::impl::rope_out_cpu(y, t.cos, t.sin, offset, c.seq, true, back);
      expect_close(back, c.x, 1e-5, "rope inverse");
    }
}

// The CUDA kernel's split of rope (kRopePairsPerThread adjacent pairs of a
// row per thread, the last chunk of a row cut short) covers every pair once:
// run here thread by thread, it equals the CPU kernel's row loop.
// FastDiv (the rope kernel's 32-bit index arithmetic) divides exactly: every
// divisor up to 2^12 against numerators near multiples and at the ends of
// the range, random ones, and large divisors; and the rows it splits land
// where the 64-bit path puts them.
TEST(Ops, FastDivisionIsExactBelowTwoToThe31) {
  using ops::rows::FastDiv;
  std::mt19937_64 rng(3);
  const uint32_t top = (uint32_t{1} << 31) - 1;
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t d : {65535u, 65537u, 1000003u, (1u << 30) + 1, top}) divisors.push_back(d);
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + static_cast<uint32_t>(rng() % top));
  for (uint32_t d : divisors) {
    const FastDiv f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, top, top - 1, top - d + 1};
    for (uint32_t k : {1u, 2u, 3u, 1000u})
      if (uint64_t{k} * d + 1 <= top) ns.insert(ns.end(), {k * d - 1, k * d, k * d + 1});
    for (int i = 0; i < 20; ++i) ns.push_back(static_cast<uint32_t>(rng() % (uint64_t{top} + 1)));
    for (uint32_t n : ns) ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
  }
  const at::Tensor x = at::zeros({3, 7, 2, 5, 16});
  ops::rows::Strided narrow = ops::impl::strided_layout(x.transpose(1, 3), x.transpose(1, 3), 3), wide = narrow;
  ASSERT_TRUE(narrow.narrow);
  wide.narrow = false;
  for (int64_t r = 0; r < ops::rows::rope_pairs(narrow) / narrow.half; ++r) {
    const auto a = ops::rows::rope_row_start(narrow, r), b = ops::rows::rope_row_start(wide, r);
    ASSERT_TRUE(a.x == b.x && a.out == b.out && a.pos == b.pos) << "row " << r;
  }
}

TEST(Ops, RopeChunkedPairsEqualRows) {
  const at::Tensor base = randn({2, 5, 3, 40}, 4);  // half 20: chunks of 8, 8, 4
  const auto t = ops::rope_tables(40, 9, 10000.0, at::kCPU);
  for (const at::Tensor& x : {base, base.transpose(1, 2)}) {
    const int64_t seq = x.size(1) == 5 ? 1 : 2;
    at::Tensor rows_out = at::empty_like(x), chunked = at::full_like(x, std::nanf(""));
    ops::impl::rope_out_cpu(x, t.cos, t.sin, 2, seq, false, rows_out);
    const ops::rows::Strided s = ops::impl::strided_layout(x, chunked, seq);
    const int64_t chunks = (s.half + ops::rows::kRopePairsPerThread - 1) / ops::rows::kRopePairsPerThread;
    const int64_t n = ops::rows::rope_pairs(s) / s.half * chunks;
    for (int64_t i = 0; i < n; ++i)
      ops::rows::rope_pairs_of_row(s, i / chunks, (i % chunks) * ops::rows::kRopePairsPerThread,
                                   ops::rows::kRopePairsPerThread, x.const_data_ptr<float>(),
                                   chunked.data_ptr<float>(), t.cos.const_data_ptr<float>(),
                                   t.sin.const_data_ptr<float>(), 2, false);
    EXPECT_TRUE(at::equal(chunked, rows_out)) << "seq dim " << seq;
  }
}

// The 16-byte-vector path (rows::rope_vec_of_row, the CUDA kernel's where
// every access is aligned, and the CPU kernel's likewise) equals the pair-by-
// pair path bit for bit; layouts it cannot take fall back.
TEST(Ops, RopeVectorPathEqualsPairByPair) {
  const auto t = ops::rope_tables(64, 16, 10000.0, at::kCPU);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    // The fused QKV layout [B, T, 3, H, hd], q rotated in place of a view.
    const at::Tensor qkv = randn({2, 12, 3, 4, 64}, 11).to(dt);
    for (const at::Tensor& x : {qkv.select(2, 0), qkv.select(2, 1).transpose(1, 2)}) {
      const int64_t seq = x.size(1) == 12 ? 1 : 2;
      at::Tensor vec = at::empty_like(x), pairs = at::empty_like(x);
      const ops::rows::Strided s = ops::impl::strided_layout(x, vec, seq);
      const bool ok = dt == at::kFloat
                          ? ops::rows::rope_vectorizable<float>(s, x.const_data_ptr(), vec.data_ptr(),
                                                                t.cos.const_data_ptr<float>(), t.sin.const_data_ptr<float>())
                          : ops::rows::rope_vectorizable<c10::BFloat16>(s, x.const_data_ptr(), vec.data_ptr(),
                                                                        t.cos.const_data_ptr<float>(),
                                                                        t.sin.const_data_ptr<float>());
      ASSERT_TRUE(ok) << "an aligned layout must take the vector path";
      ops::impl::rope_out_cpu(x, t.cos, t.sin, 3, seq, false, vec);
      // The same values one element past an aligned address: the pair path.
      const auto shifted = [&](const at::Tensor& v) {
        return at::empty({v.numel() + 1}, v.options()).narrow(0, 1, v.numel()).view(v.sizes());
      };
      const at::Tensor x_off = shifted(x).copy_(x);
      at::Tensor pairs_off = shifted(x);
      ops::impl::rope_out_cpu(x_off, t.cos, t.sin, 3, seq, false, pairs_off);
      pairs.copy_(pairs_off);
      EXPECT_TRUE(at::equal(vec, pairs)) << "seq dim " << seq << " dtype " << dt;
      EXPECT_FALSE(at::equal(vec, x));
    }
    // Not aligned: the base two elements in (bf16: 4 bytes), or a half of 20
    // pairs (not a multiple of 8 bf16): the pair path, the same values.
    const at::Tensor wide = randn({2, 12, 4, 66}, 12).to(dt);
    const at::Tensor off = wide.narrow(-1, 2, 64);
    at::Tensor y = at::empty_like(off);
    const ops::rows::Strided s = ops::impl::strided_layout(off, y, 1);
    if (dt == at::kBFloat16) {
      EXPECT_FALSE(ops::rows::rope_vectorizable<c10::BFloat16>(s, off.const_data_ptr(), y.data_ptr(),
                                                               t.cos.const_data_ptr<float>(), t.sin.const_data_ptr<float>()));
      const at::Tensor odd = randn({2, 12, 4, 40}, 13).to(dt);
      at::Tensor z = at::empty_like(odd);
      EXPECT_FALSE(ops::rows::rope_vectorizable<c10::BFloat16>(ops::impl::strided_layout(odd, z, 1),
                                                               odd.const_data_ptr(), z.data_ptr(),
                                                               t.cos.const_data_ptr<float>(), t.sin.const_data_ptr<float>()));
    }
    ops::impl::rope_out_cpu(off, t.cos, t.sin, 0, 1, false, y);
    expect_close(y.to(at::kFloat), aten_rope(off.to(at::kFloat), 0, 1, 10000.0), dt == at::kFloat ? 1e-6 : 8e-3,
                 "rope unaligned");
  }
}

// The same values one element past a 16-byte boundary: no row of it can be
// moved by 16-byte vectors, so every row kernel takes its width-1 path.
at::Tensor misaligned(const at::Tensor& v) {
  return at::empty({v.numel() + 1}, v.options()).narrow(0, 1, v.numel()).view(v.sizes()).copy_(v);
}

// RMSNorm both ways and the softmax rows by 16-byte vectors (what the CUDA
// kernels take where rows allow it) against the element-by-element path:
// the norm's bits are the same (the same sums in the same order on one
// thread); the softmax statistics rescale once per vector, so they agree to
// rounding, with a vocabulary shard whose valid columns end inside a vector.
TEST(Ops, RowKernelsVectorPathEqualsElementPath) {
  using ops::rows::rows_vectorizable;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const auto vectorizable = [dt](const at::Tensor& t, int64_t cols) {
      return dt == at::kFloat ? rows_vectorizable<float>(cols, cols, {t.const_data_ptr()})
                              : rows_vectorizable<c10::BFloat16>(cols, cols, {t.const_data_ptr()});
    };
    const std::string tag = dt == at::kFloat ? " fp32" : " bf16";
    for (bool with_bias : {false, true}) {
      const at::Tensor a = randn({5, 3, 64}, 40, dt), b = randn({5, 3, 64}, 41, dt);
      const at::Tensor w = randn({64}, 42) + 1, bias = randn({64}, 43);
      const ops::impl::Opt ob = with_bias ? ops::impl::Opt(bias) : std::nullopt;
      ASSERT_TRUE(vectorizable(a, 64));
      ASSERT_FALSE(vectorizable(misaligned(a), 64));
      auto [h, y, rstd] = ops::impl::rms_norm_fwd_cpu(a, b, w, ob, 1e-6);
      auto [h1, y1, rstd1] = ops::impl::rms_norm_fwd_cpu(misaligned(a), b, w, ob, 1e-6);
      EXPECT_TRUE(at::equal(h, h1) && at::equal(y, y1) && at::equal(rstd, rstd1)) << "forward" << tag;
      auto [h2, y2, r2] = ops::impl::rms_norm_fwd_cpu(a, std::nullopt, misaligned(w), ob, 1e-6);
      auto [h3, y3, r3] = ops::impl::rms_norm_fwd_cpu(a, std::nullopt, w, ob, 1e-6);
      EXPECT_TRUE(at::equal(y2, y3) && at::equal(r2, r3)) << "forward without residual, weight unaligned" << tag;
      expect_close(y.to(at::kFloat), aten_rms_norm(h.to(at::kFloat), w, with_bias ? bias : at::Tensor()),
                   dt == at::kFloat ? 1e-6 : 8e-3, "forward vs aten" + tag);

      const at::Tensor dy = randn({5, 3, 64}, 44, dt), dres = randn({5, 3, 64}, 45, dt);
      auto [dh, dw, db] = ops::impl::rms_norm_bwd_cpu(dy, h, w, rstd, dres, with_bias);
      auto [dh1, dw1, db1] = ops::impl::rms_norm_bwd_cpu(misaligned(dy), h, w, rstd, dres, with_bias);
      EXPECT_TRUE(at::equal(dh, dh1) && at::equal(dw, dw1) && at::equal(db, db1)) << "backward" << tag;
      auto [rdh, rdw, rdb] = ops::impl::rms_norm_bwd_ref(dy, h, w, rstd, dres, with_bias);
      expect_close(dh.to(at::kFloat), rdh.to(at::kFloat), dt == at::kFloat ? 1e-5 : 8e-3, "dh vs aten" + tag);
      expect_close(dw, rdw, 1e-5, "dw vs aten" + tag);
    }

    // Rows of 64 columns: a shard counting 61 of them, and the single-shard loss.
    const at::Tensor z0 = randn({7, 64}, 46, dt) * 4;
    const at::Tensor t = torch::tensor({0, 60, 61, 63, -1, 17, 5}, at::kLong);
    const double tol = dt == at::kFloat ? 1e-6 : 8e-3;
    ASSERT_TRUE(vectorizable(z0, 64));
    for (int64_t valid : {61, 64}) {
      const at::Tensor st = ops::impl::softmax_stats_cpu(z0, t, valid);
      const at::Tensor st1 = ops::impl::softmax_stats_cpu(misaligned(z0), t, valid);
      EXPECT_TRUE(at::equal(st[0], st1[0]) && at::equal(st[2], st1[2])) << "max and picked, valid " << valid << tag;
      expect_close(st[1], st1[1], 1e-6, "sum, valid " + std::to_string(valid) + tag);
      expect_close(st, ops::impl::softmax_stats_ref(z0, t, valid), 1e-6, "stats vs aten" + tag);
      const at::Tensor lse = st[0] + st[1].log();
      at::Tensor g = z0.clone(), g1 = misaligned(z0);
      ops::impl::softmax_grad_cpu(g, t, lse, valid);
      ops::impl::softmax_grad_cpu(g1, t, lse, valid);
      EXPECT_TRUE(at::equal(g, g1)) << "gradient, valid " << valid << tag;  // element-wise: the same bits
      EXPECT_TRUE(at::equal(g.narrow(1, valid, 64 - valid), at::zeros({7, 64 - valid}, g.options())));
    }
    at::Tensor z = z0.clone(), z1 = misaligned(z0);
    const at::Tensor loss = ops::impl::cross_entropy_rows_cpu(z, t.clamp(0, 63), true);
    const at::Tensor loss1 = ops::impl::cross_entropy_rows_cpu(z1, t.clamp(0, 63), true);
    expect_close(loss, loss1, 1e-6, "loss" + tag);
    expect_close(z.to(at::kFloat), z1.to(at::kFloat), tol, "in-place gradient" + tag);
    expect_close(loss, at::cross_entropy_loss(z0.to(at::kFloat), t.clamp(0, 63), {}, at::Reduction::None), 1e-6,
                 "loss vs aten" + tag);
  }
  // A shard cannot count more columns than its rows have.
  EXPECT_THROW(ops::impl::softmax_stats_cpu(at::zeros({2, 8}), torch::tensor({0, 1}, at::kLong), 9), std::exception);
}

TEST(Ops, RopeBf16IsFp32MathRoundedOnce) {
  const at::Tensor x = randn({2, 9, 2, 16}, 2);
  const auto t = ops::rope_tables(16, 9, 10000.0, at::kCPU);
  const at::Tensor y = ops::rope(x.to(at::kBFloat16), t, 0, 1);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  expect_close(y.to(at::kFloat), aten_rope(x.to(at::kBFloat16).to(at::kFloat), 0, 1, 10000.0), 8e-3, "rope bf16");
}

TEST(Ops, RopeGradientIsTheInverseRotation) {
  const at::Tensor x = randn({2, 5, 3, 8}, 3).requires_grad_(true);
  const at::Tensor g = randn({2, 5, 3, 8}, 4);
  const auto t = ops::rope_tables(8, 9, 500.0, at::kCPU);
  ops::rope(x, t, 4, 1).backward(g);
  const at::Tensor xr = x.detach().clone().requires_grad_(true);
  aten_rope(xr, 4, 1, 500.0).backward(g);
  expect_close(x.grad(), xr.grad(), 1e-6, "rope grad");
}

// MLA's queries: cat({head, rope(x)}) in one buffer, as aten gives it, and
// x's gradient in x's own memory order (heads transposed off a [B, T, H * r]
// GEMM output), so it reaches that GEMM as a view; plain rope's too.
TEST(Ops, RopeConcatMatchesCatOfTheRotationWithGradients) {
  const int64_t B = 2, T = 5, H = 3, h = 4, r = 8;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const double tol = dt == at::kFloat ? 1e-6 : 1e-2;
    const at::Tensor head = randn({B, H, T, h}, 11, dt).requires_grad_(true);
    const at::Tensor flat = randn({B, T, H * r}, 12, dt).requires_grad_(true);
    const at::Tensor g = randn({B, H, T, h + r}, 13, dt);
    const auto t = ops::rope_tables(r, 2 + T, 10000.0, at::kCPU);
    const at::Tensor x = flat.view({B, T, H, r}).transpose(1, 2);
    const at::Tensor y = ops::rope_concat(head, x, t, 2, 2);
    const at::Tensor headr = head.detach().to(at::kFloat).requires_grad_(true);
    const at::Tensor flatr = flat.detach().to(at::kFloat).requires_grad_(true);
    const at::Tensor yr = at::cat({headr, aten_rope(flatr.view({B, T, H, r}).transpose(1, 2), 2, 2, 10000.0)}, -1);
    expect_close(y, yr, tol, "rope_concat");
    y.backward(g);
    yr.backward(g.to(at::kFloat));
    expect_close(head.grad(), headr.grad(), tol, "d head");
    expect_close(flat.grad(), flatr.grad(), tol, "d x");
    // The rotation's gradient is laid out as x is.
    auto captured = std::make_shared<at::Tensor>();
    const at::Tensor x2 = flat.detach().view({B, T, H, r}).transpose(1, 2).requires_grad_(true);
    x2.register_hook([captured](const at::Tensor& grad) { *captured = grad; });
    ops::rope_concat(head.detach(), x2, t, 2, 2).backward(g);
    EXPECT_EQ(captured->strides(), x2.strides());
    ops::rope(x2, t, 2, 2).backward(g.narrow(-1, h, r).contiguous());
    EXPECT_EQ(captured->strides(), x2.strides());
  }
}

// The attention input: q, k rotated and v passed through, values and the
// gradient of qkv (written in one buffer) as three separate aten paths give.
TEST(Ops, QkvRopeMatchesSeparateRotations) {
  const int64_t B = 2, T = 6, H = 3, hd = 8;
  for (int64_t offset : {0, 3}) {
    const at::Tensor qkv = randn({B, T, 3, H, hd}, 5).requires_grad_(true);
    const auto t = ops::rope_tables(hd, offset + T, 10000.0, at::kCPU);
    auto [q, k, v] = ops::qkv_rope(qkv, t, offset);
    ASSERT_EQ(q.sizes(), (std::vector<int64_t>{B, H, T, hd}));
    const at::Tensor gq = randn({B, H, T, hd}, 6), gk = randn({B, H, T, hd}, 7), gv = randn({B, H, T, hd}, 8);
    ((q * gq).sum() + (k * gk).sum() + (v * gv).sum()).backward();

    const at::Tensor r = qkv.detach().clone().requires_grad_(true);
    const at::Tensor rq = aten_rope(r.select(2, 0), offset, 1, 10000.0).transpose(1, 2);
    const at::Tensor rk = aten_rope(r.select(2, 1), offset, 1, 10000.0).transpose(1, 2);
    const at::Tensor rv = r.select(2, 2).transpose(1, 2);
    expect_close(q, rq, 1e-6, "q");
    expect_close(k, rk, 1e-6, "k");
    expect_close(v, rv, 0, "v");
    ((rq * gq).sum() + (rk * gk).sum() + (rv * gv).sum()).backward();
    expect_close(qkv.grad(), r.grad(), 1e-6, "d qkv");
  }
}

TEST(Ops, RmsNormAndItsResidualAddMatchAtenWithGradients) {
  for (bool with_bias : {false, true}) {
    const at::Tensor w = (randn({16}, 9) + 1).requires_grad_(true);
    const at::Tensor bias = with_bias ? randn({16}, 10).requires_grad_(true) : at::Tensor();
    const at::Tensor a = randn({3, 4, 16}, 11).requires_grad_(true), b = randn({3, 4, 16}, 12).requires_grad_(true);
    const at::Tensor gh = randn({3, 4, 16}, 13), gy = randn({3, 4, 16}, 14);
    auto [h, y] = ops::add_rms_norm(a, b, w, bias, 1e-6);
    ((h * gh).sum() + (y * gy).sum()).backward();

    const at::Tensor ra = a.detach().clone().requires_grad_(true), rb = b.detach().clone().requires_grad_(true);
    const at::Tensor rw = w.detach().clone().requires_grad_(true);
    const at::Tensor rbias = with_bias ? bias.detach().clone().requires_grad_(true) : at::Tensor();
    const at::Tensor rh = ra + rb, ry = aten_rms_norm(rh, rw, rbias);
    ((rh * gh).sum() + (ry * gy).sum()).backward();
    const std::string tag = with_bias ? " (bias)" : "";
    expect_close(h, rh, 0, "h" + tag);
    expect_close(y, ry, 1e-6, "y" + tag);
    expect_close(a.grad(), ra.grad(), 1e-5, "da" + tag);
    expect_close(b.grad(), rb.grad(), 1e-5, "db" + tag);
    expect_close(w.grad(), rw.grad(), 1e-5, "dw" + tag);
    if (with_bias) expect_close(bias.grad(), rbias.grad(), 1e-5, "dbias");

    // The plain norm, and the composite of both directions.
    const at::Tensor x = a.detach().clone().requires_grad_(true);
    w.mutable_grad() = at::Tensor();
    ops::rms_norm(x, w, bias, 1e-6).backward(gy);
    const at::Tensor rx = a.detach().clone().requires_grad_(true);
    rw.mutable_grad() = at::Tensor();
    aten_rms_norm(rx, rw, rbias).backward(gy);
    expect_close(x.grad(), rx.grad(), 1e-5, "dx" + tag);
    expect_close(w.grad(), rw.grad(), 1e-5, "dw plain" + tag);
    auto [ch, cy, crstd] = ops::impl::rms_norm_fwd_ref(a.detach(), b.detach(), w.detach(),
                                                       with_bias ? std::optional<at::Tensor>(bias.detach())
                                                                 : std::nullopt, 1e-6);
    expect_close(cy, y, 1e-6, "composite y" + tag);
    auto [cdh, cdw, cdb] = ops::impl::rms_norm_bwd_ref(gy, ch, w.detach(), crstd, gh, with_bias);
    auto [kdh, kdw, kdb] = ops::impl::rms_norm_bwd_cpu(gy, ch, w.detach(), crstd, gh, with_bias);
    expect_close(kdh, cdh, 1e-5, "composite dh" + tag);
    expect_close(kdw, cdw, 1e-5, "composite dw" + tag);
  }
}

// The residual stream's norm: x flows on through the first output and its
// gradient from there is summed inside the norm's backward. Also the
// residual add folded into the output GEMM (Linear::forward_residual).
TEST(Ops, ResidualNormAndGemmResidualMatchAtenWithGradients) {
  const at::Tensor w = (randn({16}, 30) + 1).requires_grad_(true);
  const at::Tensor x = randn({3, 4, 16}, 31).requires_grad_(true), lin = randn({16, 16}, 32).requires_grad_(true);
  const at::Tensor g = randn({3, 4, 16}, 33);
  auto [r, y] = ops::residual_rms_norm(x, w, {}, 1e-6);
  PlainLinear layer(lin);
  (layer.forward_residual(y, r) * g).sum().backward();

  const at::Tensor rx = x.detach().clone().requires_grad_(true), rw = w.detach().clone().requires_grad_(true);
  const at::Tensor rl = lin.detach().clone().requires_grad_(true);
  ((rx + at::linear(aten_rms_norm(rx, rw, {}), rl)) * g).sum().backward();
  expect_close(x.grad(), rx.grad(), 1e-5, "dx");
  expect_close(w.grad(), rw.grad(), 1e-5, "dw");
  expect_close(lin.grad(), rl.grad(), 1e-5, "dlinear");
  // Only the stream used (the norm's output unused) and only the norm used.
  const at::Tensor x2 = x.detach().clone().requires_grad_(true);
  auto [r2, y2] = ops::residual_rms_norm(x2, w.detach(), {}, 1e-6);
  (r2 * g).sum().backward();
  expect_close(x2.grad(), g, 0, "dx stream only");
  const at::Tensor x3 = x.detach().clone().requires_grad_(true), rx3 = x.detach().clone().requires_grad_(true);
  auto [r3, y3] = ops::residual_rms_norm(x3, w.detach(), {}, 1e-6);
  (y3 * g).sum().backward();
  (aten_rms_norm(rx3, w.detach(), {}) * g).sum().backward();
  expect_close(x3.grad(), rx3.grad(), 1e-5, "dx norm only");
}

// Where the CUDA RMSNorm backward keeps a block's column sums: the kernel's
// static shared memory counts against the 48 KiB a block gets without
// opting in (the launch failed at D 12288 without a bias, 6144 with);
// beyond it the attribute is raised up to the device's opt-in limit, and
// past that the sums stay in global memory. (The kernel at those widths:
// Cuda.RmsNormBackwardAtWideRows.)
TEST(Ops, RmsNormBackwardSharedMemoryCountsTheStaticPart) {
  constexpr int64_t kDefault = 48 * 1024, kHopper = 227 * 1024, kStatic = 128;
  using ops::launch::norm_bwd_sums;
  const auto small = norm_bwd_sums(768, true, kStatic, kDefault, kHopper);
  EXPECT_TRUE(small.in_shared);
  EXPECT_FALSE(small.opt_in);
  EXPECT_EQ(small.dynamic_bytes, 768 * 4 * 2);
  // The widths that failed: 48 KiB of sums plus the static scratch.
  for (const auto& [D, bias] : {std::pair<int64_t, bool>{12288, false}, {6144, true}}) {
    const auto p = norm_bwd_sums(D, bias, kStatic, kDefault, kHopper);
    EXPECT_TRUE(p.in_shared && p.opt_in) << D;
    EXPECT_EQ(p.dynamic_bytes, kDefault) << D;
    EXPECT_LE(p.dynamic_bytes + kStatic, kHopper) << D;
    // Where the device allows no more than the default: global memory.
    const auto old = norm_bwd_sums(D, bias, kStatic, kDefault, kDefault);
    EXPECT_FALSE(old.in_shared) << D;
    EXPECT_EQ(old.dynamic_bytes, 0) << D;
  }
  // Just under the default with the static part counted, and just over.
  const int64_t fits = (kDefault - kStatic) / 4;
  EXPECT_FALSE(norm_bwd_sums(fits, false, kStatic, kDefault, kHopper).opt_in);
  EXPECT_TRUE(norm_bwd_sums(fits + 1, false, kStatic, kDefault, kHopper).opt_in);
  // Wider than any shared memory: global partial sums, no dynamic bytes.
  const auto wide = norm_bwd_sums(65536, true, kStatic, kDefault, kHopper);
  EXPECT_FALSE(wide.in_shared);
  EXPECT_FALSE(wide.opt_in);
  EXPECT_EQ(wide.dynamic_bytes, 0);
}

TEST(Ops, RmsNormBf16KeepsFp32Statistics) {
  const at::Tensor x = randn({64, 32}, 15) * 30, w = randn({32}, 16);
  const at::Tensor y = ops::rms_norm(x.to(at::kBFloat16), w, {}, 1e-6);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  expect_close(y.to(at::kFloat), aten_rms_norm(x.to(at::kBFloat16).to(at::kFloat), w, {}), 8e-3, "bf16 norm");
}

TEST(Ops, CrossEntropyRowsGiveLossAndGradientInPlace) {
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor z0 = randn({37, 101}, 17, dt) * 3;
    const at::Tensor t = at::randint(0, 101, {37}, at::make_generator<at::CPUGeneratorImpl>(18), at::kLong);
    at::Tensor z = z0.clone();
    const at::Tensor loss = ops::cross_entropy_rows_(z, t, true);
    const at::Tensor zf = z0.to(at::kFloat);
    const double tol = dt == at::kFloat ? 1e-6 : 8e-3;
    expect_close(loss, at::cross_entropy_loss(zf, t, {}, at::Reduction::None), 1e-6, "loss");
    const at::Tensor grad = at::softmax(zf, 1) - at::one_hot(t, 101).to(at::kFloat);
    expect_close(z.to(at::kFloat), grad, tol, "in-place gradient");
    at::Tensor zr = z0.clone();
    const at::Tensor lr = ops::impl::cross_entropy_rows_ref(zr, t, true);
    expect_close(lr, loss, 1e-6, "composite loss");
    expect_close(zr.to(at::kFloat), z.to(at::kFloat), tol, "composite gradient");
    // Without grad the logits stay.
    at::Tensor keep = z0.clone();
    ops::cross_entropy_rows_(keep, t, false);
    EXPECT_TRUE(at::equal(keep, z0));
  }
}

// A vocabulary shard: padding columns past `valid`, targets in other shards.
TEST(Ops, SoftmaxStatsAndGradOverAShard) {
  const at::Tensor z0 = randn({9, 12}, 19);
  const at::Tensor t = torch::tensor({0, 3, 9, -1, 11, 5, 20, 2, 8}, at::kLong);
  const int64_t valid = 10;
  const at::Tensor st = ops::softmax_stats(z0, t, valid);
  const at::Tensor zv = z0.narrow(1, 0, valid);
  expect_close(st[0], std::get<0>(zv.max(1)), 0, "max");
  expect_close(st[1], (zv - st[0].unsqueeze(1)).exp().sum(1), 1e-6, "sum");
  const at::Tensor in = (t >= 0) & (t < valid);
  expect_close(st[2], zv.gather(1, t.clamp(0, valid - 1).unsqueeze(1)).squeeze(1) * in, 0, "picked");
  expect_close(ops::impl::softmax_stats_ref(z0, t, valid), st, 1e-6, "composite stats");
  const at::Tensor lse = st[0] + st[1].log() + 0.25;  // as if other shards added mass
  at::Tensor z = z0.clone();
  ops::softmax_grad_(z, t, lse, valid);
  at::Tensor want = at::zeros_like(z0);
  want.narrow(1, 0, valid).copy_((zv - lse.unsqueeze(1)).exp());
  for (int64_t r = 0; r < 9; ++r)
    if (in[r].item<bool>()) want[r][t[r].item<int64_t>()] -= 1;
  expect_close(z, want, 1e-6, "shard gradient");
  at::Tensor zr = z0.clone();
  ops::impl::softmax_grad_ref(zr, t, lse, valid);
  expect_close(zr, z, 1e-6, "composite shard gradient");
}

// The head: losses and both gradients of the chunked GEMM + cross-entropy,
// for chunks that do and do not divide the rows.
TEST(Ops, ChunkedCrossEntropyMatchesAtenWithGradients) {
  for (int64_t chunk : {1, 4, 7, 100}) {
    const at::Tensor h = randn({10, 6}, 20).requires_grad_(true), w = randn({23, 6}, 21).requires_grad_(true);
    const at::Tensor t = at::randint(0, 23, {10}, at::make_generator<at::CPUGeneratorImpl>(22), at::kLong);
    const at::Tensor g = randn({10}, 23);
    const at::Tensor loss = chunked_cross_entropy(h, w, t, chunk);
    (loss * g).sum().backward();
    const at::Tensor hr = h.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
    const at::Tensor ref = at::cross_entropy_loss(at::mm(hr, wr.t()), t, {}, at::Reduction::None);
    (ref * g).sum().backward();
    const std::string tag = "chunk " + std::to_string(chunk);
    expect_close(loss, ref, 1e-6, tag);
    expect_close(h.grad(), hr.grad(), 1e-5, "dh " + tag);
    expect_close(w.grad(), wr.grad(), 1e-5, "dw " + tag);
  }
}

// Token n's assignments a = n * k + j in rows of a buffer (ops/slot_rows.h),
// against aten in fp32: the dispatch gather, the weighted combine and both
// gradients, by vectors (d 24) and element by element (d 6), with dropped
// assignments (-1) and a token that lost both of its.
TEST(Ops, SlotRowsMatchAtenWithGradients) {
  const int64_t N = 5, k = 2, R = 13;
  const at::Tensor slot = at::randperm(R, at::make_generator<at::CPUGeneratorImpl>(3), at::kLong)
                              .narrow(0, 0, N * k)
                              .index_put_({at::tensor({3, 6, 7})}, -1)
                              .view({N, k});
  const ops::SlotMap map = ops::slot_map(slot, R);
  const at::Tensor held = slot >= 0;
  // The inverse: each kept assignment's row names it, and no other row does.
  EXPECT_EQ(map.owner.ge(0).sum().item<int64_t>(), held.sum().item<int64_t>());
  for (int64_t a = 0; a < N * k; ++a)
    if (slot.view({-1})[a].item<int64_t>() >= 0)
      EXPECT_EQ(map.owner[slot.view({-1})[a].item<int64_t>()].item<int64_t>(), a);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (int64_t d : {24, 6}) {
      const std::string tag = std::string(c10::toString(dt)) + " d " + std::to_string(d);
      const double tol = dt == at::kFloat ? 1e-6 : 1e-2;
      const at::Tensor x = randn({N, d}, 4, dt).requires_grad_(), y = randn({R, d}, 5, dt).requires_grad_();
      const at::Tensor w = randn({N, k}, 6).requires_grad_();
      const at::Tensor gb = randn({R, d}, 7, dt), g = randn({N, d}, 8, dt);
      // aten, fp32: the gather (zero rows where no assignment sits) and the sum.
      const at::Tensor xr = x.detach().to(at::kFloat).requires_grad_(), yr = y.detach().to(at::kFloat).requires_grad_();
      const at::Tensor wr = w.detach().clone().requires_grad_();
      const at::Tensor owned = map.owner >= 0;
      const at::Tensor buf_ref = xr.index_select(0, map.owner.clamp_min(0).div(k, "floor")) * owned.unsqueeze(1);
      const at::Tensor out_ref =
          (yr.index_select(0, slot.clamp_min(0).view({-1})).view({N, k, d}) * (wr * held).unsqueeze(2)).sum(1);
      (buf_ref * gb.to(at::kFloat)).sum().backward();
      (out_ref * g.to(at::kFloat)).sum().backward();

      const at::Tensor buf = ops::slots_from_tokens(x, map);
      EXPECT_TRUE(at::equal(buf, buf_ref.detach().to(dt))) << "dispatch " << tag;
      buf.backward(gb);
      expect_close(x.grad(), xr.grad(), tol, "dispatch dx " + tag);
      const at::Tensor out = ops::tokens_from_slots(y, w, map);
      EXPECT_EQ(out.scalar_type(), dt);
      expect_close(out, out_ref, tol, "combine " + tag);
      out.backward(g);
      expect_close(y.grad(), yr.grad(), tol, "combine dy " + tag);
      expect_close(w.grad(), wr.grad(), tol, "combine dw " + tag);
      EXPECT_EQ(w.grad().masked_select(~held).abs().sum().item<float>(), 0.0f) << "dropped assignments' gates";
      EXPECT_EQ(w.grad().scalar_type(), at::kFloat);

      // The aten composites (CUDA builds without nvcc) give the kernels' values.
      const at::Tensor yd = y.detach(), wd = w.detach().contiguous();
      expect_close(ops::impl::combine_rows_ref(yd, slot, wd), ops::impl::combine_rows_cpu(yd, slot, wd), tol, "ref " + tag);
      auto [sp, sdw] = ops::impl::spread_rows_cpu(g, map.owner, k, wd, yd);
      auto [rp, rdw] = ops::impl::spread_rows_ref(g, map.owner, k, wd, yd);
      expect_close(rp, sp, 1e-6, "ref spread " + tag);
      expect_close(rdw, sdw, 1e-5, "ref dw " + tag);
    }
  // k 1, fp16, every assignment dropped: zero outputs and gradients.
  const ops::SlotMap none = ops::slot_map(at::full({3, 1}, -1, at::kLong), 4);
  EXPECT_TRUE(at::equal(none.owner, at::full({4}, -1, at::kLong)));
  const at::Tensor yh = randn({4, 16}, 10, at::kHalf).requires_grad_(), wh = randn({3, 1}, 11).requires_grad_();
  const at::Tensor outh = ops::tokens_from_slots(yh, wh, none);
  EXPECT_EQ(outh.abs().sum().item<float>(), 0.0f);
  outh.backward(randn({3, 16}, 12, at::kHalf));
  EXPECT_EQ(yh.grad().abs().sum().item<float>() + wh.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(ops::slots_from_tokens(randn({3, 16}, 13, at::kHalf), none).abs().sum().item<float>(), 0.0f);
  // A row that does not exist is refused, not read.
  EXPECT_THROW(ops::impl::combine_rows_cpu(randn({R, 8}, 9), slot.clone().fill_(R), std::nullopt), std::exception);
  EXPECT_THROW(ops::impl::spread_rows_cpu(randn({N, 8}, 9), map.owner.clone().fill_(N * k), k, std::nullopt,
                                          std::nullopt),
               std::exception);
}

TEST(Ops, MetaKernelsGiveShapes) {
  const auto meta = at::TensorOptions().dtype(at::kBFloat16).device(at::kMeta);
  const at::Tensor qkv = at::empty({2, 16, 3, 4, 8}, meta);
  const auto t = ops::rope_tables(8, 16, 10000.0, at::kMeta);
  auto [q, k, v] = ops::qkv_rope(qkv, t, 0);
  EXPECT_EQ(q.sizes(), (std::vector<int64_t>{2, 4, 16, 8}));
  const at::Tensor w = at::empty({8}, meta.dtype(at::kFloat));
  auto [h, y] = ops::add_rms_norm(at::empty({2, 16, 8}, meta), at::empty({2, 16, 8}, meta), w, {}, 1e-6);
  EXPECT_EQ(y.sizes(), h.sizes());
  at::Tensor z = at::empty({32, 50}, meta);
  EXPECT_EQ(ops::cross_entropy_rows_(z, at::empty({32}, meta.dtype(at::kLong)), true).sizes(),
            (std::vector<int64_t>{32}));
  const ops::SlotMap map = ops::slot_map(at::empty({32, 2}, meta.dtype(at::kLong)), 48);
  EXPECT_EQ(ops::slots_from_tokens(at::empty({32, 8}, meta), map).sizes(), (std::vector<int64_t>{48, 8}));
  EXPECT_EQ(ops::tokens_from_slots(at::empty({48, 8}, meta), at::empty({32, 2}, meta.dtype(at::kFloat)), map).sizes(),
            (std::vector<int64_t>{32, 8}));
}

}  // namespace
}  // namespace meshtrain
