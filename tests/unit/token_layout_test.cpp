// Token layouts (model/token_layout.h): packed documents give each document's
// own logits, context-parallel chunks sit where they belong, and the varlen
// tables CUDA's flash path reads describe the same attention as the mask.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "meshtrain/model/layers.h"
#include "meshtrain/model/token_layout.h"
#include "meshtrain/model/transformer.h"
#include "tiny_model.h"

namespace meshtrain {
namespace {

constexpr int64_t kEot = 0;

// The unit tests' tiny model at T 24 (rows of four documents).
ModelConfig tiny(AttentionKind attention, FfnKind ffn, int64_t kv_heads = 0) {
  ModelConfig c = test::tiny_model(attention, ffn);
  c.n_kv_head = kv_heads;
  c.T = 24;
  return c;
}

// Rows of documents (tokens 1.. and each ending with kEot), the last one cut
// by the row's end as packing cuts it.
at::Tensor packed_rows(const std::vector<std::vector<int64_t>>& lengths, int64_t T, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor rows = at::empty({static_cast<int64_t>(lengths.size()), T}, at::kLong);
  for (size_t b = 0; b < lengths.size(); ++b) {
    int64_t t = 0;
    for (int64_t len : lengths[b]) {
      for (int64_t i = 0; i < len && t < T; ++i, ++t)
        rows[static_cast<int64_t>(b)][t] = i + 1 == len ? kEot : 1 + at::randint(vocab - 1, {1}, gen, at::kLong).item<int64_t>();
    }
    for (; t < T; ++t) rows[static_cast<int64_t>(b)][t] = 1 + (t % (vocab - 1));
  }
  return rows;
}

struct Case {
  std::string name;
  AttentionKind attention;
  FfnKind ffn;
  int64_t kv_heads;
};

class PackedDocuments : public ::testing::TestWithParam<Case> {};

// Each document of a packed row, run on its own from position 0, gives the
// packed row's logits token for token (the eot belongs to the document it
// ends; the row's last document is cut by the row end).
TEST_P(PackedDocuments, EqualDocumentsRunOneByOne) {
  const Case& p = GetParam();
  const ModelConfig cfg = tiny(p.attention, p.ffn, p.kv_heads);
  LayerFactory f;
  Transformer m(cfg, f);
  m.eval();
  const std::vector<std::vector<int64_t>> lengths = {{5, 9, 3, 7}, {1, 12, 2, 9}};
  const at::Tensor tokens = packed_rows(lengths, cfg.T, cfg.vocab_size, 3);
  const TokenLayout layout = make_token_layout(tokens, kEot, 0, 1, at::kCPU);
  const at::Tensor packed = m.logits(m.forward_layers(m.embed(tokens), nullptr, nullptr, &layout));
  const at::Tensor plain = m.logits(m.forward_layers(m.embed(tokens), nullptr));
  for (size_t b = 0; b < lengths.size(); ++b) {
    int64_t start = 0;
    for (int64_t len : lengths[b]) {
      const int64_t n = std::min(len, cfg.T - start);
      const at::Tensor doc = tokens.narrow(0, static_cast<int64_t>(b), 1).narrow(1, start, n);
      const at::Tensor alone = m.logits(m.forward_layers(m.embed(doc), nullptr));
      const at::Tensor got = packed.narrow(0, static_cast<int64_t>(b), 1).narrow(1, start, n);
      EXPECT_TRUE(at::allclose(got, alone, 1e-5, 1e-5))
          << p.name << ": row " << b << ", document at " << start << " (length " << n << "), max diff "
          << (got - alone).abs().max().item<double>();
      start += n;
      if (start >= cfg.T) break;
    }
  }
  // Without the layout the later documents read the earlier ones.
  EXPECT_FALSE(at::allclose(packed, plain, 1e-4, 1e-4)) << p.name;
}

INSTANTIATE_TEST_SUITE_P(Attention, PackedDocuments,
                         ::testing::Values(Case{"mha", AttentionKind::Mha, FfnKind::Dense, 0},
                                           Case{"gqa", AttentionKind::Mha, FfnKind::Dense, 2},
                                           Case{"mla_moe", AttentionKind::Mla, FfnKind::Moe, 0}),
                         [](const auto& info) { return info.param.name; });

TEST(TokenLayout, DocumentsAndPositionsRestartAfterEachEot) {
  const at::Tensor tokens = at::tensor({5, 0, 7, 8, 0, 0, 3, 4}, at::kLong).view({1, 8});
  const TokenLayout L = make_token_layout(tokens, 0, 0, 1, at::kCPU);
  EXPECT_TRUE(at::equal(L.positions, at::tensor({0, 1, 0, 1, 2, 0, 0, 1}, at::kLong).view({1, 8})));
  EXPECT_TRUE(at::equal(L.doc, at::tensor({0, 0, 1, 1, 1, 2, 3, 3}, at::kLong).view({1, 8})));
  // eot < 0: one document, positions 0..T-1.
  const TokenLayout one = make_token_layout(tokens, -1, 0, 1, at::kCPU);
  EXPECT_FALSE(one.doc.defined());
  EXPECT_TRUE(at::equal(one.positions, at::arange(8, at::kLong).view({1, 8})));
}

// Rank r of cp holds chunks r and 2cp-1-r: together the ranks hold every
// token once, and each the same causal work.
TEST(TokenLayout, ContextChunksCoverTheSequenceOnceWithEqualWork) {
  for (int64_t cp : {1, 2, 4}) {
    const int64_t T = 8 * cp;
    std::vector<at::Tensor> all;
    std::vector<int64_t> work;
    for (int64_t r = 0; r < cp; ++r) {
      const at::Tensor idx = context_chunk_index(T, r, cp, at::kCPU);
      ASSERT_EQ(idx.size(0), T / cp);
      all.push_back(idx);
      work.push_back((idx + 1).sum().item<int64_t>());  // keys read under the causal mask
      const at::Tensor x = at::arange(T, at::kLong).view({1, T});
      EXPECT_TRUE(at::equal(context_chunks(x, 1, r, cp).view({-1}), idx));
    }
    EXPECT_TRUE(at::equal(std::get<0>(at::cat(all).sort()), at::arange(T, at::kLong))) << "cp " << cp;
    for (int64_t w : work) EXPECT_EQ(w, work[0]) << "cp " << cp;
  }
  EXPECT_TRUE(at::equal(context_chunk_index(8, 1, 2, at::kCPU), at::tensor({2, 3, 4, 5}, at::kLong)));
  EXPECT_THROW(context_chunk_index(10, 0, 4, at::kCPU), std::exception);
}

// The varlen tables, read as flash reads them (each segment's queries over
// its keys, causal aligned bottom-right), give the masked attention: checked
// on the CPU with one sdpa per segment.
TEST(TokenLayout, VarlenTablesDescribeTheMaskedAttention) {
  const int64_t B = 2, H = 2, D = 8, T = 16;
  const std::vector<std::vector<int64_t>> lengths = {{3, 6, 4, 5}, {16}};
  const at::Tensor tokens = packed_rows(lengths, T, 50, 5);
  for (int64_t cp : {1, 2}) {
    for (int64_t rank = 0; rank < cp; ++rank) {
      const TokenLayout L = make_token_layout(tokens, kEot, rank, cp, at::kCPU, /*varlen=*/true);
      const int64_t Tl = T / cp;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + rank);
      const at::Tensor q = at::randn({B, H, Tl, D}, gen), k = at::randn({B, H, T, D}, gen),
                       v = at::randn({B, H, T, D}, gen);
      const at::Tensor want = layout_attention(q, k, v, 0.0, L);  // the mask path on CPU
      const auto rows = [](const at::Tensor& t) { return t.transpose(1, 2).reshape({-1, t.size(1), t.size(3)}); };
      const at::Tensor qf = rows(q), kf = rows(k).index_select(0, L.k_rows), vf = rows(v).index_select(0, L.k_rows);
      at::Tensor got = at::empty_like(qf);
      for (int64_t s = 0; s + 1 < L.cu_q.size(0); ++s) {
        const int64_t q0 = L.cu_q[s].item<int64_t>(), nq = L.cu_q[s + 1].item<int64_t>() - q0;
        const int64_t k0 = L.cu_k[s].item<int64_t>(), nk = L.cu_k[s + 1].item<int64_t>() - k0;
        ASSERT_LE(nq, L.max_q);
        ASSERT_LE(nk, L.max_k);
        const auto head_major = [](const at::Tensor& t) { return t.transpose(0, 1).unsqueeze(0); };  // [1, H, n, D]
        const at::Tensor mask = at::arange(nk).unsqueeze(0) <= (at::arange(nq) + (nk - nq)).unsqueeze(1);
        const at::Tensor o = at::scaled_dot_product_attention(head_major(qf.narrow(0, q0, nq)),
                                                              head_major(kf.narrow(0, k0, nk)),
                                                              head_major(vf.narrow(0, k0, nk)), mask);
        got.narrow(0, q0, nq).copy_(o.squeeze(0).transpose(0, 1));
      }
      ASSERT_EQ(L.cu_q[-1].item<int64_t>(), B * Tl);
      got = got.view({B, Tl, H, D}).transpose(1, 2);
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "cp " << cp << " rank " << rank << ": max diff "
                                                        << (got - want).abs().max().item<double>();
    }
  }
}

// Rope at per-token positions equals rope at an offset when the positions
// are offset.., and rotates each row by its own positions.
TEST(TokenLayout, RopeAtPositionsMatchesRopeAtOffsets) {
  Rotary rope(10000.0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor x = at::randn({2, 6, 3, 8}, gen);
  const at::Tensor pos = at::stack({at::arange(4, 10, at::kLong), at::arange(0, 6, at::kLong)});
  const at::Tensor got = rope.apply_at(x, pos, 16);
  EXPECT_TRUE(at::allclose(got[0], rope.apply(x.narrow(0, 0, 1), 4, 1)[0], 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(got[1], rope.apply(x.narrow(0, 1, 1), 0, 1)[0], 1e-6, 1e-6));
}

}  // namespace
}  // namespace meshtrain
