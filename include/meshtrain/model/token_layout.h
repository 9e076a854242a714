#pragma once
// Where the tokens of one forward sit in their sequences, when that is more
// than "positions 0..T-1, causal over the row": packed documents
// (data_config.document_masking: attention within a document, rope positions
// restarting at each) and context parallelism (device_config.
// context_parallel: a rank holds two chunks of each sequence and reads the
// other ranks' keys). Built once per microbatch from the whole sequences'
// tokens (parallel/context_parallel.h) and read by every layer; plain
// training and decoding pass none.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace meshtrain {

struct TokenLayout {
  // Rope position of each local token, [B, Tl] int64.
  at::Tensor positions;
  // Each local token's index in its whole sequence, [Tl] int64 (0..T-1
  // without context parallelism).
  at::Tensor q_index;
  int64_t T = 0;  // whole-sequence length (keys per row)
  // Document masking: the document of every token of the whole rows, [B, T]
  // int64, and of each local token, [B, Tl]; undefined: one document per row.
  // A query reads the keys at or before it in its own document.
  at::Tensor doc, q_doc;
  // The varlen flash path (CUDA, half precision; no T x T mask): per
  // (row, chunk, document) segment, the queries' cumulative counts cu_q and
  // the keys' cu_k (int32), k_rows the key rows of each segment in order
  // (indices into the [B * T] keys), and the longest segments. Undefined
  // on CPU.
  at::Tensor cu_q, cu_k, k_rows;
  int64_t max_q = 0, max_k = 0;
  // Context parallelism: the whole sequence along `dim` from every cp rank's
  // local chunks, in order (all-gather forward, reduce-scatter backward).
  // Empty without context parallelism.
  std::function<at::Tensor(const at::Tensor&, int64_t dim)> gather;
  int64_t cp = 1;
};

// Rank r of cp holds chunks r and 2cp-1-r of a sequence cut into 2cp equal
// chunks: every rank then does the same causal attention work. The whole
// sequence's indices of those tokens, [T / cp] int64 on `device`.
at::Tensor context_chunk_index(int64_t T, int64_t cp_rank, int64_t cp, const at::Device& device);
// x's local chunks along dim (x.size(dim) == T).
at::Tensor context_chunks(const at::Tensor& x, int64_t dim, int64_t cp_rank, int64_t cp);

// The layout of whole sequences `tokens` [B, T] (int64, on the host): with
// eot >= 0 a document ends with each eot token (it belongs to the document
// it ends, as Megatron's reset_attention_mask); eot < 0: one document per row.
// The tensors land on `device`; the varlen tables (CUDA's flash path) only
// with `varlen`.
TokenLayout make_token_layout(const at::Tensor& tokens, int64_t eot, int64_t cp_rank, int64_t cp,
                              const at::Device& device, bool varlen = false);

// Attention of this rank's queries q [B, H, Tl, D] over the whole sequence's
// keys and values k, v [B, H, T, *] (values may be narrower than D) under
// the layout: flash varlen on CUDA in half precision, else sdpa with a
// boolean mask [B or 1, 1, Tl, T] made for the call (never kept).
at::Tensor layout_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                            const TokenLayout& layout);

}  // namespace meshtrain
