#include "meshtrain/parallel/mappings.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

enum class Op : int64_t { Identity, AllReduce, AllGather, ReduceScatter, KeepChunk };

// One op of a forward/backward pair. Never modifies x in place: autograd may
// have saved it.
at::Tensor apply_op(Op op, const at::Tensor& x, Communicator& comm, int64_t dim) {
  switch (op) {
    case Op::Identity:
      return x;
    case Op::AllReduce: {
      at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
      comm.all_reduce(y);
      return y;
    }
    case Op::AllGather:
      return comm.all_gather(x, dim);
    case Op::ReduceScatter:
      return comm.reduce_scatter(x, dim);
    case Op::KeepChunk: {
      const int64_t n = x.size(dim);
      MT_CHECK(n % comm.size() == 0, "tp split: dim ", dim, " of shape ", x.sizes(), " is not divisible by tp = ",
               comm.size(), " (hint: under sequence_parallel, T must be a multiple of tp)");
      const int64_t chunk = n / comm.size();
      return x.narrow(dim, comm.rank() * chunk, chunk).contiguous();
    }
  }
  MT_ASSERT(false, "unknown tp op");
  return x;
}

// The communicator travels through saved_data as an integer: IValue holds no
// raw pointers, and the caller guarantees it outlives the graph.
class PairedCollective : public torch::autograd::Function<PairedCollective> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t comm, int64_t fwd,
                            int64_t bwd, int64_t dim) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["bwd"] = bwd;
    ctx->saved_data["dim"] = dim;
    return apply_op(static_cast<Op>(fwd), x, *reinterpret_cast<Communicator*>(comm), dim);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    const auto op = static_cast<Op>(ctx->saved_data["bwd"].toInt());
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {apply_op(op, grads[0], *comm, dim), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor paired(const at::Tensor& x, Communicator& comm, Op fwd, Op bwd, int64_t dim) {
  if (comm.size() == 1) return x;
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  MT_ASSERT(d >= 0 && d < x.dim(), "tp collective dim ", dim, " out of range for shape ", x.sizes());
  return PairedCollective::apply(x, reinterpret_cast<int64_t>(&comm), static_cast<int64_t>(fwd),
                                 static_cast<int64_t>(bwd), d);
}

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, Communicator& tp) {
  return paired(x, tp, Op::Identity, Op::AllReduce, 0);
}
at::Tensor reduce_from_tp(const at::Tensor& x, Communicator& tp) {
  return paired(x, tp, Op::AllReduce, Op::Identity, 0);
}
at::Tensor scatter_to_tp(const at::Tensor& x, Communicator& tp, int64_t dim) {
  return paired(x, tp, Op::KeepChunk, Op::AllGather, dim);
}
at::Tensor gather_from_tp(const at::Tensor& x, Communicator& tp, int64_t dim) {
  return paired(x, tp, Op::AllGather, Op::KeepChunk, dim);
}

at::Tensor gather_from_sequence(const at::Tensor& x, Communicator& tp) {
  return paired(x, tp, Op::AllGather, Op::ReduceScatter, kSequenceDim);
}
at::Tensor reduce_scatter_to_sequence(const at::Tensor& x, Communicator& tp) {
  return paired(x, tp, Op::ReduceScatter, Op::AllGather, kSequenceDim);
}
at::Tensor gather_sequence_replicated(const at::Tensor& x, Communicator& tp) {
  return gather_from_tp(x, tp, kSequenceDim);
}
at::Tensor scatter_sequence(const at::Tensor& x, Communicator& tp) {
  return scatter_to_tp(x, tp, kSequenceDim);
}

at::Tensor gather_from_group(const at::Tensor& x, Communicator& group, int64_t dim) {
  return paired(x.contiguous(), group, Op::AllGather, Op::ReduceScatter, dim);
}

}  // namespace meshtrain
