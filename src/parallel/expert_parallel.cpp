// The all-to-all token dispatcher of expert parallelism; see
// meshtrain/parallel/expert_parallel.h.
#include "meshtrain/parallel/expert_parallel.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

// The communicator travels through saved_data as an integer (IValue holds no
// raw pointers); the model keeps it alive as long as the graph.
class AllToAllV : public torch::autograd::Function<AllToAllV> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t comm,
                            std::vector<int64_t> send_rows, std::vector<int64_t> recv_rows) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return reinterpret_cast<Communicator*>(comm)->all_to_all_v(x, send_rows, recv_rows);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    // The reverse exchange: what came from rank j goes back to rank j.
    const auto send = ctx->saved_data["send"].toIntVector();
    const auto recv = ctx->saved_data["recv"].toIntVector();
    return {comm->all_to_all_v(grad[0].contiguous(), recv, send), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Even all-to-all: the reverse exchange is the same exchange.
class AllToAll : public torch::autograd::Function<AllToAll> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return reinterpret_cast<Communicator*>(comm)->all_to_all(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    return {comm->all_to_all(grad[0].contiguous()), at::Tensor()};
  }
};

int64_t handle(Communicator& c) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(&c)); }

class AllToAllDispatcher : public TokenDispatcher {
 public:
  explicit AllToAllDispatcher(Communicator& ep) : ep_(ep) {}

  int64_t size() const override { return ep_.size(); }
  int64_t rank() const override { return ep_.rank(); }

  Dispatched dispatch(const at::Tensor& rows, const std::vector<int64_t>& counts) override {
    return exchange(rows, at::tensor(counts, at::kLong).to(rows.device()));
  }

  at::Tensor combine(const at::Tensor& rows, const Dispatched& d) override {
    // Back to arrival order (the inverse permutation), then back to the senders.
    const at::Tensor back = at::zeros_like(rows).index_copy(0, d.order, rows);
    return AllToAllV::apply(back, handle(ep_), d.received, d.sent);
  }

  at::Tensor run_experts(const at::Tensor& rows, const at::Tensor& expert, int64_t n_experts,
                         const ExpertsFn& experts) override {
    // A scatter, not bincount (which sizes its output from the data: a host read).
    const at::Tensor counts = at::zeros({n_experts}, expert.options()).scatter_add_(0, expert, at::ones_like(expert));
    const Exchanged mine = exchange(rows, counts);
    // the sender's rows, in their order
    return combine(experts(mine.rows, mine.device_counts, mine.row_expert, mine.row_sender), mine);
  }

  at::Tensor dispatch_slots(const at::Tensor& slots) override {
    const int64_t ep = ep_.size(), E = slots.size(0), S = slots.size(1), dm = slots.size(2);
    MT_CHECK(E % ep == 0, "expert parallelism: ", E, " experts do not split over expert_parallel = ", ep);
    // [E, S, d] in expert order is already [ep, E_local, S, d] by destination.
    const at::Tensor in = AllToAll::apply(slots.contiguous(), handle(ep_));  // [ep (source), E_local, S, d]
    return in.view({ep, E / ep, S, dm}).transpose(0, 1).reshape({E / ep, ep * S, dm});
  }

  at::Tensor combine_slots(const at::Tensor& out) override {
    const int64_t ep = ep_.size(), local = out.size(0), S = out.size(1) / ep, dm = out.size(2);
    const at::Tensor by_source = out.view({local, ep, S, dm}).transpose(0, 1).contiguous();  // [ep, E_local, S, d]
    return AllToAll::apply(by_source, handle(ep_)).view({ep * local, S, dm});
  }

 private:
  struct Exchanged : Dispatched {
    at::Tensor device_counts;  // [E_local] rows per local expert, on the device
    at::Tensor row_expert;     // [rows] local expert of each row, on the device
    at::Tensor row_sender;     // [rows] the ep rank each row came from, on the device
  };

  // The counts go first, device to device (an even all-to-all of E int64);
  // the rows follow by all_to_all_v, whose split sizes MPI and NCCL take as
  // host numbers: that one read per MoE layer and microbatch (both
  // directions' splits and the per-expert counts in one copy) is the only
  // host sync of the exchange. Capacity slots (dispatch_slots) need none; a
  // dropless exchange padded to a fixed size would have to reserve every
  // row for every peer (ep times the traffic).
  Exchanged exchange(const at::Tensor& rows, const at::Tensor& counts) {
    const int64_t ep = ep_.size(), E = counts.size(0);
    MT_CHECK(E % ep == 0, "expert parallelism: ", E, " experts do not split over expert_parallel = ", ep);
    const int64_t local = E / ep;
    const at::Tensor got = ep_.all_to_all(counts).view({ep, local});  // [source rank, local expert]
    Exchanged d;
    d.device_counts = got.sum(0);
    const at::Tensor host = at::cat({counts.view({ep, local}).sum(1), got.sum(1), d.device_counts}).cpu();
    const auto* h = host.data_ptr<int64_t>();
    d.sent.assign(h, h + ep);
    d.received.assign(h + ep, h + 2 * ep);
    d.counts.assign(h + 2 * ep, h + 2 * ep + local);
    int64_t arrived = 0;
    for (int64_t r : d.received) arrived += r;
    const at::Tensor in = AllToAllV::apply(rows, handle(ep_), d.sent, d.received);
    // What arrived is grouped by (source, local expert); the experts want it
    // grouped by (local expert, source), each block keeping its row order: a
    // stable device sort of each row's key. A row's block is the number of
    // block ends at or before it.
    const auto opts = counts.options();
    const at::Tensor ends = got.reshape({-1}).cumsum(0);
    const at::Tensor block = at::searchsorted(ends, at::arange(arrived, opts), /*out_int32=*/false, /*right=*/true);
    const at::Tensor key = at::remainder(block, local) * ep + at::floor_divide(block, local);
    auto [sorted, order] = at::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false);
    d.order = order;
    d.row_expert = at::floor_divide(sorted, ep);
    d.row_sender = at::remainder(sorted, ep);
    d.rows = in.index_select(0, d.order);
    return d;
  }

  Communicator& ep_;
};

}  // namespace

std::shared_ptr<TokenDispatcher> make_all_to_all_dispatcher(Communicator& ep) {
  return std::make_shared<AllToAllDispatcher>(ep);
}

}  // namespace meshtrain
