#pragma once
// Tokens to MoE expert rows and back, one kernel each way (operators
// meshtrain::spread_rows / meshtrain::combine_rows, CPU, meta and CUDA
// kernels over src/ops/slot_math.h).
//
// Token n's k routing assignments are a = n * k + j. A buffer of `rows` rows
// (capacity slots, or the assignments sorted by expert) holds each kept
// assignment in one row, and each row holds at most one assignment. The
// dispatch is a gather of token rows into the buffer (rows no assignment
// holds are zero); the combine is, per token, the gate-weighted sum of its
// assignments' rows. Their backwards are each other: the dispatch's is the
// combine's sum (weight 1) of the buffer's gradient, the combine's the
// dispatch's gather of the output gradient times the weights, which also
// yields the weights' gradient from the saved rows. So no zeroed buffer is
// scattered into, no weighted copy of the rows is made, and no k-wide
// product is summed in a kernel of its own (issue: moe1B's step, 3+ GB of
// index_add / mul / sum / zero_ traffic).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace meshtrain::ops {

struct SlotMap {
  at::Tensor slot;   // [N, k] int64: the row of assignment n * k + j, -1 if none
  at::Tensor owner;  // [rows] int64: the assignment a row holds, -1 if none
  int64_t k = 1;
};

// The map of slot ([N, k] int64, each value in [-1, rows), no row twice; not
// checked on a GPU, which would need a host read) into a buffer of `rows` rows.
SlotMap slot_map(const at::Tensor& slot, int64_t rows);

// [rows, d]: row r is x[owner[r] / k], zero where owner[r] < 0. x: [N, d].
// Differentiable in x.
at::Tensor slots_from_tokens(const at::Tensor& x, const SlotMap& m);

// [N, d] in y's dtype: sum over j of weight[n, j] * y[slot[n, j]], fp32 math,
// assignments without a row adding nothing. y: [rows, d]; weight [N, k] fp32.
// Differentiable in y and weight (the weight's gradient in fp32).
at::Tensor tokens_from_slots(const at::Tensor& y, const at::Tensor& weight, const SlotMap& m);

}  // namespace meshtrain::ops
