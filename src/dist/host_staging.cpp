// Host staging for CUDA tensors over an MPI communicator: each collective copies
// its CUDA operands into pinned host memory, runs the MPI collective there and
// copies the result back to the operand's device. Slower than NCCL, but several
// ranks may then share one GPU (NCCL refuses that), so every multi-rank test
// can run on a single-GPU machine (device_config.collectives "mpi").
#include <torch/torch.h>

#include <utility>

#include "backends.h"

namespace meshtrain {
namespace {

class HostStagedCommunicator final : public Communicator {
 public:
  explicit HostStagedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    if (!on_gpu(t)) return counted("all_reduce", [&] { inner_->all_reduce(t, op); });
    at::Tensor h = to_host(t);
    counted("all_reduce", [&] { inner_->all_reduce(h, op); });
    t.copy_(h);
  }

  at::Tensor all_gather(const at::Tensor& t, int64_t dim) override {
    at::Tensor out;
    counted("all_gather", [&] { out = inner_->all_gather(on_gpu(t) ? to_host(t) : t, dim); });
    return on_gpu(t) ? out.to(t.device()) : out;
  }

  at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim) override {
    at::Tensor out;
    counted("reduce_scatter", [&] { out = inner_->reduce_scatter(on_gpu(t) ? to_host(t) : t, dim); });
    return on_gpu(t) ? out.to(t.device()) : out;
  }

  void broadcast(at::Tensor& t, int root) override {
    if (!on_gpu(t)) return counted("broadcast", [&] { inner_->broadcast(t, root); });
    at::Tensor h = to_host(t);
    counted("broadcast", [&] { inner_->broadcast(h, root); });
    t.copy_(h);
  }

  at::Tensor gather(const at::Tensor& t, int root) override {
    at::Tensor out;
    counted("gather", [&] { out = inner_->gather(on_gpu(t) ? to_host(t) : t, root); });
    return on_gpu(t) && out.defined() ? out.to(t.device()) : out;
  }

  void send(const at::Tensor& t, int dst, int tag) override {
    counted("send", [&] { inner_->send(on_gpu(t) ? to_host(t) : t, dst, tag); });
  }

  void recv(at::Tensor& t, int src, int tag) override {
    if (!on_gpu(t)) return counted("recv", [&] { inner_->recv(t, src, tag); });
    at::Tensor h = pinned_like(t);
    counted("recv", [&] { inner_->recv(h, src, tag); });
    t.copy_(h);
  }

  void send_recv(const at::Tensor& t, int dst, at::Tensor& r, int src, int send_tag, int recv_tag) override {
    at::Tensor h = on_gpu(r) ? pinned_like(r) : r;
    const at::Tensor sent = on_gpu(t) ? to_host(t) : t;
    {
      const Timed timer = timed("send_recv");
      inner_->record_flight(flight_recorder(), flight_axis());
      inner_->send_recv(sent, dst, h, src, send_tag, recv_tag);
    }
    count("send", t.nbytes(), t.scalar_type());
    count("recv", r.nbytes(), r.scalar_type());
    if (on_gpu(r)) r.copy_(h);
  }

  at::Tensor all_to_all(const at::Tensor& t) override {
    at::Tensor out;
    counted("all_to_all", [&] { out = inner_->all_to_all(on_gpu(t) ? to_host(t) : t); });
    return on_gpu(t) ? out.to(t.device()) : out;
  }

  at::Tensor all_to_all_v(const at::Tensor& t, const std::vector<int64_t>& send_rows,
                          const std::vector<int64_t>& recv_rows) override {
    at::Tensor out;
    counted("all_to_all_v", [&] { out = inner_->all_to_all_v(on_gpu(t) ? to_host(t) : t, send_rows, recv_rows); });
    return on_gpu(t) ? out.to(t.device()) : out;
  }

  void barrier() override {
    counted("barrier", [&] { inner_->barrier(); });
  }

 private:
  // Anything not on the CPU is staged; undefined tensors go through so the
  // inner backend's error message names them.
  static bool on_gpu(const at::Tensor& t) { return t.defined() && t.is_cuda(); }

  static at::Tensor pinned_like(const at::Tensor& t) {
    // Pinned pages come from torch's caching host allocator, so steady-state
    // steps reuse them instead of pinning memory per call.
    return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  }

  // A blocking copy: it waits for the kernels on the current stream that
  // produce t, so MPI never reads a half-written buffer.
  static at::Tensor to_host(const at::Tensor& t) {
    at::Tensor h = pinned_like(t);
    h.copy_(t);
    return h;
  }

  // The bytes the inner communicator counted, booked under the same op.
  template <class F>
  void counted(const char* op, F&& f) {
    const int64_t before = inner_->bytes_moved();
    const std::map<std::string, int64_t> dtypes = inner_->bytes_by_dtype();
    const Timed timer = timed(op);
    // The inner communicator does the op: it records it, as this axis.
    inner_->record_flight(flight_recorder(), flight_axis());
    f();
    count(op, inner_->bytes_moved() - before);
    for (const auto& [dtype, bytes] : inner_->bytes_by_dtype()) {
      const auto it = dtypes.find(dtype);
      add_dtype_bytes(dtype, bytes - (it == dtypes.end() ? 0 : it->second));
    }
  }

  std::unique_ptr<Communicator> inner_;
};

}  // namespace

std::unique_ptr<Communicator> host_staged(std::unique_ptr<Communicator> inner) {
  return std::make_unique<HostStagedCommunicator>(std::move(inner));
}

}  // namespace meshtrain
