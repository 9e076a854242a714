// Token layouts for packed documents and context parallelism (see token_layout.h).
#include "meshtrain/model/token_layout.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

// The global [first, end) of each local chunk of a row.
std::vector<std::pair<int64_t, int64_t>> local_chunks(int64_t T, int64_t cp_rank, int64_t cp) {
  if (cp == 1) return {{0, T}};
  const int64_t c = T / (2 * cp);
  return {{cp_rank * c, (cp_rank + 1) * c}, {(2 * cp - 1 - cp_rank) * c, (2 * cp - cp_rank) * c}};
}

// Flash's varlen tables: every (row, local chunk, document) is one segment
// whose queries read the keys from the document's start to the segment's
// last query (causal aligned bottom-right, as flash aligns it when a segment
// has fewer queries than keys).
void varlen_tables(TokenLayout& L, const at::Tensor& doc, const at::Tensor& pos, int64_t cp_rank,
                   const at::Device& device) {
  const int64_t B = doc.size(0), T = doc.size(1);
  const auto d = doc.accessor<int64_t, 2>();
  const auto p = pos.accessor<int64_t, 2>();
  std::vector<int32_t> cu_q{0}, cu_k{0};
  std::vector<int64_t> k_rows;
  for (int64_t b = 0; b < B; ++b) {
    for (const auto& [g0, g1] : local_chunks(T, cp_rank, L.cp)) {
      for (int64_t i = g0; i < g1;) {
        int64_t j = i;
        while (j < g1 && d[b][j] == d[b][i]) ++j;
        const int64_t start = i - p[b][i];  // the document's first token
        for (int64_t t = start; t < j; ++t) k_rows.push_back(b * T + t);
        cu_q.push_back(cu_q.back() + static_cast<int32_t>(j - i));
        cu_k.push_back(cu_k.back() + static_cast<int32_t>(j - start));
        L.max_q = std::max(L.max_q, j - i);
        L.max_k = std::max(L.max_k, j - start);
        i = j;
      }
    }
  }
  const auto i32 = at::TensorOptions().dtype(at::kInt);
  L.cu_q = at::tensor(cu_q, i32).to(device);
  L.cu_k = at::tensor(cu_k, i32).to(device);
  L.k_rows = at::tensor(k_rows, at::TensorOptions().dtype(at::kLong)).to(device);
}

}  // namespace

at::Tensor context_chunk_index(int64_t T, int64_t cp_rank, int64_t cp, const at::Device& device) {
  MT_CHECK(cp >= 1 && cp_rank >= 0 && cp_rank < cp, "context parallel rank ", cp_rank, " of ", cp);
  MT_CHECK(cp == 1 || T % (2 * cp) == 0, "context parallelism cuts a sequence of ", T, " tokens into 2 * ", cp,
           " chunks: T must be divisible by ", 2 * cp, " (device_config.context_parallel)");
  std::vector<at::Tensor> parts;
  for (const auto& [a, b] : local_chunks(T, cp_rank, cp)) parts.push_back(at::arange(a, b, at::kLong));
  return at::cat(parts).to(device);
}

at::Tensor context_chunks(const at::Tensor& x, int64_t dim, int64_t cp_rank, int64_t cp) {
  if (cp == 1) return x;
  const int64_t T = x.size(dim);
  MT_CHECK(T % (2 * cp) == 0, "context parallelism cuts a sequence of ", T, " tokens into 2 * ", cp,
           " chunks: T must be divisible by ", 2 * cp, " (device_config.context_parallel)");
  std::vector<at::Tensor> parts;
  for (const auto& [a, b] : local_chunks(T, cp_rank, cp)) parts.push_back(x.narrow(dim, a, b - a));
  return at::cat(parts, dim);
}

TokenLayout make_token_layout(const at::Tensor& tokens, int64_t eot, int64_t cp_rank, int64_t cp,
                              const at::Device& device, bool varlen) {
  MT_CHECK(tokens.dim() == 2 && tokens.is_cpu(), "token layout: tokens must be [B, T] on the host, got ",
           tokens.sizes(), " on ", tokens.device());
  const int64_t B = tokens.size(0), T = tokens.size(1);
  TokenLayout L;
  L.T = T;
  L.cp = cp;
  // Document and in-document position of every token: a document ends with
  // its eot, so the token after an eot starts the next one at position 0.
  const at::Tensor tok = tokens.to(at::kLong).contiguous();
  at::Tensor doc = at::empty({B, T}, at::kLong), pos = at::empty({B, T}, at::kLong);
  {
    const auto t = tok.accessor<int64_t, 2>();
    auto d = doc.accessor<int64_t, 2>();
    auto p = pos.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      int64_t id = 0, start = 0;
      for (int64_t i = 0; i < T; ++i) {
        d[b][i] = id;
        p[b][i] = i - start;
        if (eot >= 0 && t[b][i] == eot) {
          ++id;
          start = i + 1;
        }
      }
    }
  }
  const at::Tensor qi = context_chunk_index(T, cp_rank, cp, at::kCPU);
  L.q_index = qi.to(device);
  L.positions = pos.index_select(1, qi).to(device);
  if (eot >= 0) {
    L.doc = doc.to(device);
    L.q_doc = doc.index_select(1, qi).to(device);
  }
  if (varlen) varlen_tables(L, doc, pos, cp_rank, device);
  return L;
}

at::Tensor layout_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                            const TokenLayout& L) {
  const int64_t B = q.size(0), H = q.size(1), Tl = q.size(2), D = q.size(3), Dv = v.size(3);
  MT_ASSERT(k.size(2) == L.T && v.size(2) == L.T && Tl == L.q_index.size(0) && Dv <= D,
            "layout attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), " for T ", L.T, " and ",
            L.q_index.size(0), " local tokens");
  // Flash kernels want one head size: values zero-padded to D (the extra
  // output columns are 0 and cut off; the softmax comes from q and k alone).
  const bool pad = Dv < D && !q.is_cpu();
  const at::Tensor vp = pad ? at::constant_pad_nd(v, {0, D - Dv}) : v;
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  at::Tensor out;
  if (q.is_cuda() && half && L.cu_q.defined()) {
    // [B, H, t, D] -> [B * t, H, D]: the varlen kernels' packed rows.
    const auto rows = [](const at::Tensor& t) { return t.transpose(1, 2).reshape({-1, t.size(1), t.size(3)}); };
    const at::Tensor kf = rows(k).index_select(0, L.k_rows), vf = rows(vp).index_select(0, L.k_rows);
    out = std::get<0>(at::_flash_attention_forward(rows(q), kf, vf, L.cu_q, L.cu_k, L.max_q, L.max_k, dropout,
                                                   /*is_causal=*/true, /*return_debug_mask=*/false));
    out = out.view({B, Tl, H, D}).transpose(1, 2);
  } else {
    const at::Tensor keys = at::arange(L.T, L.q_index.options());
    at::Tensor mask = (keys.unsqueeze(0) <= L.q_index.unsqueeze(1)).unsqueeze(0);  // [1, Tl, T]
    if (L.doc.defined()) mask = mask & (L.q_doc.unsqueeze(2) == L.doc.unsqueeze(1));
    out = at::scaled_dot_product_attention(q, k, vp, mask.unsqueeze(1), dropout, /*is_causal=*/false);
  }
  return pad ? out.narrow(-1, 0, Dv) : out;
}

}  // namespace meshtrain
