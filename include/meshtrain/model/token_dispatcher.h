#pragma once
// The token-dispatcher seam of the MoE layer (Megatron-Core's
// route -> dispatch -> compute -> combine): MoE::forward routes its tokens,
// hands the rows for the routed experts to a TokenDispatcher, computes its own
// experts on what comes back, and returns the outputs through combine. The
// default dispatcher is local (every expert on this rank, dispatch and combine
// are the identity); expert parallelism's all-to-all dispatcher lives in
// parallel/expert_parallel.h, so the model stays single-device code.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace meshtrain {

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;

  // The routed experts are split over size() ranks; this rank holds
  // n_experts / size() of them, starting at rank() * n_experts / size().
  virtual int64_t size() const { return 1; }
  virtual int64_t rank() const { return 0; }

  // By counts (dropless, expert biases, evaluation): `rows` [M, d] are grouped
  // by global expert, counts[e] rows for expert e (on the host). dispatch
  // returns the rows of this rank's experts grouped by local expert, with
  // their counts; combine takes their outputs (same rows, same order) back to
  // the sender's order. Both are differentiable.
  struct Dispatched {
    at::Tensor rows;                       // [sum(counts), d]
    std::vector<int64_t> counts;           // rows per local expert
    std::vector<int64_t> sent, received;   // rows per peer (all-to-all splits)
    at::Tensor order;                      // received row -> position in `rows` (int64)
  };
  virtual Dispatched dispatch(const at::Tensor& rows, const std::vector<int64_t>& counts);
  virtual at::Tensor combine(const at::Tensor& rows, const Dispatched& d);

  // Dropless: `rows` [M, d] sorted by global expert (`expert` [M], int64,
  // ascending) go to their experts; `experts(rows, counts, row_expert,
  // row_sender)` runs this rank's experts on what arrives (counts [E_local]
  // and row_expert [rows] on the rows' device, by local expert; row_sender
  // [rows] the rank of size() that sent each row, whose rows come in
  // sender order within an expert) and the outputs come back in `rows`'
  // order. Local: counts stay on the device (no host sync); expert
  // parallelism reads them on the host for the uneven exchange (dispatch,
  // then combine).
  using ExpertsFn = std::function<at::Tensor(const at::Tensor& rows, const at::Tensor& counts,
                                             const at::Tensor& row_expert, const at::Tensor& row_sender)>;
  virtual at::Tensor run_experts(const at::Tensor& rows, const at::Tensor& expert, int64_t n_experts,
                                 const ExpertsFn& experts);

  // By capacity slots (static shapes, no host sync): slots [E, S, d] hold S
  // rows per global expert; dispatch_slots returns [E / size(), size() * S, d]
  // (this rank's experts, the senders' slots side by side) and combine_slots
  // is its inverse.
  virtual at::Tensor dispatch_slots(const at::Tensor& slots) { return slots; }
  virtual at::Tensor combine_slots(const at::Tensor& out) { return out; }
};

}  // namespace meshtrain
