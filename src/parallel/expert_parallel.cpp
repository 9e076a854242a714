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
    const auto ep = static_cast<int64_t>(ep_.size());
    const auto E = static_cast<int64_t>(counts.size());
    MT_CHECK(E % ep == 0, "expert parallelism: ", E, " experts do not split over expert_parallel = ", ep);
    const int64_t local = E / ep;
    Dispatched d;
    // Rows for rank j: the contiguous run of its experts' rows.
    d.sent.assign(static_cast<size_t>(ep), 0);
    for (int64_t e = 0; e < E; ++e) d.sent[static_cast<size_t>(e / local)] += counts[static_cast<size_t>(e)];
    // Every peer learns how many rows it gets per local expert: an even
    // all-to-all of the counts (one host read, like the local path's).
    at::Tensor c = at::tensor(counts, at::kLong).to(rows.device());
    const at::Tensor got = ep_.all_to_all(c).cpu().view({ep, local});  // [source rank, local expert]
    const auto* g = got.data_ptr<int64_t>();
    d.received.assign(static_cast<size_t>(ep), 0);
    d.counts.assign(static_cast<size_t>(local), 0);
    for (int64_t j = 0; j < ep; ++j)
      for (int64_t l = 0; l < local; ++l) {
        d.received[static_cast<size_t>(j)] += g[j * local + l];
        d.counts[static_cast<size_t>(l)] += g[j * local + l];
      }
    const at::Tensor in = AllToAllV::apply(rows, handle(ep_), d.sent, d.received);
    // What arrived is grouped by source, then expert; the experts want it
    // grouped by expert, then source.
    std::vector<int64_t> start(static_cast<size_t>(ep * local));
    int64_t at_row = 0;
    for (int64_t i = 0; i < ep * local; ++i) {
      start[static_cast<size_t>(i)] = at_row;
      at_row += g[i];
    }
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(at_row));
    for (int64_t l = 0; l < local; ++l)
      for (int64_t j = 0; j < ep; ++j)
        for (int64_t r = 0; r < g[j * local + l]; ++r) order.push_back(start[static_cast<size_t>(j * local + l)] + r);
    d.order = at::tensor(order, at::kLong).to(rows.device());
    d.rows = in.index_select(0, d.order);
    return d;
  }

  at::Tensor combine(const at::Tensor& rows, const Dispatched& d) override {
    // Back to arrival order (the inverse permutation), then back to the senders.
    const at::Tensor back = at::zeros_like(rows).index_copy(0, d.order, rows);
    return AllToAllV::apply(back, handle(ep_), d.received, d.sent);
  }

  // The all-to-all's splits are host numbers: one sync per layer, inherent
  // to expert parallelism's uneven exchange.
  at::Tensor run_experts(const at::Tensor& rows, const at::Tensor& expert, int64_t n_experts,
                         const ExpertsFn& experts) override {
    const at::Tensor counts = at::bincount(expert, {}, n_experts).cpu();
    const std::vector<int64_t> count(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + n_experts);
    const Dispatched mine = dispatch(rows, count);
    const auto local_counts = at::tensor(mine.counts, expert.options().device(at::kCPU)).to(expert.device());
    const at::Tensor local_expert =
        at::repeat_interleave(at::arange(static_cast<int64_t>(mine.counts.size()), expert.options()), local_counts,
                              0, mine.rows.size(0));
    return combine(experts(mine.rows, local_counts, local_expert), mine);  // the sender's rows, in their order
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
  Communicator& ep_;
};

}  // namespace

std::shared_ptr<TokenDispatcher> make_all_to_all_dispatcher(Communicator& ep) {
  return std::make_shared<AllToAllDispatcher>(ep);
}

}  // namespace meshtrain
