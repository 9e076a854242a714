// NCCL backend of Communicator: CUDA tensors on the current stream. Compiled
// only when nccl.h was found; otherwise nccl_communicator() explains why not.
#include <torch/torch.h>

#include "backends.h"
#include "meshtrain/core/check.h"
#include "meshtrain/dist/device.h"

#ifdef MESHTRAIN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <vector>
#ifdef MESHTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace meshtrain {
namespace {

ncclDataType_t nccl_dtype(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte:
    case at::kBool: return ncclUint8;
    default: MT_FAIL("nccl ", op, ": dtype ", t, " is not supported");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

int64_t norm_dim(const at::Tensor& t, int64_t dim, const char* op) { return meshtrain::norm_dim(t, dim, "nccl", op); }

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(Communicator& bootstrap) : rank_(bootstrap.rank()), size_(bootstrap.size()) {
    int dev = 0;
    MT_CHECK(cudaGetDevice(&dev) == cudaSuccess, "nccl init on rank ", rank_, ": no usable CUDA device");
    device_ = dev;
    // The id travels as bytes over the group's MPI communicator (CPU tensor).
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) ok(ncclGetUniqueId(&id), "get_unique_id");
    at::Tensor buf = at::empty({static_cast<int64_t>(sizeof id)}, at::kByte);
    std::memcpy(buf.data_ptr(), &id, sizeof id);
    bootstrap.broadcast(buf, 0);
    std::memcpy(&id, buf.data_ptr(), sizeof id);
    ok(ncclCommInitRank(&comm_, size_, id, rank_), "comm_init_rank");
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    const FlightScope in_flight = flight("all_reduce", t);
    check_cuda(t, "all_reduce");
    at::Tensor w = t.to(reduction_dtype(t.scalar_type())).contiguous();
    ok(ncclAllReduce(w.data_ptr(), w.data_ptr(), w.numel(), nccl_dtype(w.scalar_type(), "all_reduce"),
                     nccl_op(op), comm_, stream(w)),
       "all_reduce");
    if (!w.is_same(t)) t.copy_(w);
    count("all_reduce", w.nbytes(), w.scalar_type());
  }

  at::Tensor all_gather(const at::Tensor& t, int64_t dim) override {
    const FlightScope in_flight = flight("all_gather", t);
    check_cuda(t, "all_gather");
    const int64_t d = norm_dim(t, dim, "all_gather");
    at::Tensor x = t.contiguous();
    at::Tensor out = stacked_empty(x, size_);
    ok(ncclAllGather(x.data_ptr(), out.data_ptr(), x.numel(), nccl_dtype(x.scalar_type(), "all_gather"), comm_,
                     stream(x)),
       "all_gather");
    count("all_gather", out.nbytes(), out.scalar_type());
    return merge_blocks(out, d);
  }

  at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim) override {
    const FlightScope in_flight = flight("reduce_scatter", t);
    check_cuda(t, "reduce_scatter");
    at::Tensor x = chunks_first(t, norm_dim(t, dim, "reduce_scatter"), size_, "nccl");
    at::Tensor out = at::empty(x.sizes().slice(1), x.options());
    ok(ncclReduceScatter(x.data_ptr(), out.data_ptr(), out.numel(), nccl_dtype(x.scalar_type(), "reduce_scatter"),
                         ncclSum, comm_, stream(x)),
       "reduce_scatter");
    count("reduce_scatter", x.nbytes(), x.scalar_type());
    return out.to(t.scalar_type());
  }

  void broadcast(at::Tensor& t, int root) override {
    const FlightScope in_flight = flight("broadcast", t, root);
    check_cuda(t, "broadcast");
    check_peer(root, "broadcast", "root");
    at::Tensor w = t.contiguous();
    ok(ncclBroadcast(w.data_ptr(), w.data_ptr(), w.numel(), nccl_dtype(w.scalar_type(), "broadcast"), root, comm_,
                     stream(w)),
       "broadcast");
    if (!w.is_same(t)) t.copy_(w);
    count("broadcast", t.nbytes(), t.scalar_type());
  }

  // NCCL has no gather: the root receives from every peer in one group of
  // send/recv pairs (a single launch, so the order of peers cannot deadlock).
  at::Tensor gather(const at::Tensor& t, int root) override {
    const FlightScope in_flight = flight("gather", t, root);
    check_cuda(t, "gather");
    check_peer(root, "gather", "root");
    MT_CHECK(t.dim() > 0, "nccl gather on rank ", rank_, ": needs a tensor with at least one dim, got a scalar");
    at::Tensor x = t.contiguous();
    const auto type = nccl_dtype(x.scalar_type(), "gather");
    cudaStream_t s = stream(x);
    if (rank_ != root) {
      ok(ncclSend(x.data_ptr(), x.numel(), type, root, comm_, s), "gather(send)");
      count("gather", x.nbytes(), x.scalar_type());
      return {};
    }
    at::Tensor out = gathered_empty(x, size_);
    const int64_t chunk_bytes = static_cast<int64_t>(x.nbytes());
    auto* dst = static_cast<char*>(out.data_ptr());
    ok(ncclGroupStart(), "gather(group_start)");
    for (int peer = 0; peer < size_; ++peer)
      if (peer != root) ok(ncclRecv(dst + peer * chunk_bytes, x.numel(), type, peer, comm_, s), "gather(recv)");
    ok(ncclGroupEnd(), "gather(group_end)");
    out.narrow(0, root * x.size(0), x.size(0)).copy_(x);
    count("gather", out.nbytes(), out.scalar_type());
    return out;
  }

  // NCCL has no tags: messages between a pair arrive in the order they were
  // posted, which is how the pipeline schedules use them anyway.
  void send(const at::Tensor& t, int dst, int /*tag*/) override {
    const FlightScope in_flight = flight("send", t, dst);
    check_cuda(t, "send");
    check_peer(dst, "send", "dst");
    at::Tensor x = t.contiguous();
    ok(ncclSend(x.data_ptr(), x.numel(), nccl_dtype(x.scalar_type(), "send"), dst, comm_, stream(x)), "send");
    count("send", t.nbytes(), t.scalar_type());
  }

  void recv(at::Tensor& t, int src, int /*tag*/) override {
    const FlightScope in_flight = flight("recv", t, src);
    check_cuda(t, "recv");
    check_peer(src, "recv", "src");
    at::Tensor w = t.contiguous();
    ok(ncclRecv(w.data_ptr(), w.numel(), nccl_dtype(w.scalar_type(), "recv"), src, comm_, stream(w)), "recv");
    if (!w.is_same(t)) t.copy_(w);
    count("recv", t.nbytes(), t.scalar_type());
  }

  // One group: NCCL runs both halves at once, whichever the peers post first.
  void send_recv(const at::Tensor& t, int dst, at::Tensor& r, int src, int /*send_tag*/, int /*recv_tag*/) override {
    const FlightScope in_flight = flight("send_recv", t, dst);
    check_cuda(t, "send_recv");
    check_cuda(r, "send_recv");
    check_peer(dst, "send_recv", "dst");
    check_peer(src, "send_recv", "src");
    at::Tensor x = t.contiguous();
    at::Tensor w = r.contiguous();
    cudaStream_t s = stream(w);
    ok(ncclGroupStart(), "send_recv(group_start)");
    ok(ncclSend(x.data_ptr(), x.numel(), nccl_dtype(x.scalar_type(), "send_recv"), dst, comm_, s), "send_recv(send)");
    ok(ncclRecv(w.data_ptr(), w.numel(), nccl_dtype(w.scalar_type(), "send_recv"), src, comm_, s), "send_recv(recv)");
    ok(ncclGroupEnd(), "send_recv(group_end)");
    if (!w.is_same(r)) r.copy_(w);
    count("send", t.nbytes(), t.scalar_type());
    count("recv", r.nbytes(), r.scalar_type());
  }

  at::Tensor all_to_all(const at::Tensor& t) override {
    const FlightScope in_flight = flight("all_to_all", t);
    check_cuda(t, "all_to_all");
    const Timed timer = timed("all_to_all");
    check_all_to_all(t, size_, "nccl");
    at::Tensor x = t.contiguous();
    at::Tensor out = at::empty_like(x);
    const auto type = nccl_dtype(x.scalar_type(), "all_to_all");
    const int64_t chunk = x.numel() / size_;
    const int64_t chunk_bytes = static_cast<int64_t>(x.nbytes()) / size_;
    auto* src = static_cast<char*>(x.data_ptr());
    auto* dst = static_cast<char*>(out.data_ptr());
    cudaStream_t s = stream(x);
    ok(ncclGroupStart(), "all_to_all(group_start)");
    for (int peer = 0; peer < size_; ++peer) {
      ok(ncclSend(src + peer * chunk_bytes, chunk, type, peer, comm_, s), "all_to_all(send)");
      ok(ncclRecv(dst + peer * chunk_bytes, chunk, type, peer, comm_, s), "all_to_all(recv)");
    }
    ok(ncclGroupEnd(), "all_to_all(group_end)");
    count("all_to_all", t.nbytes(), t.scalar_type());
    return out;
  }

  // Grouped send/recv pairs: NCCL has no all-to-all-v, and the group makes
  // them one launch that cannot deadlock whatever the order of peers.
  at::Tensor all_to_all_v(const at::Tensor& t, const std::vector<int64_t>& send_rows,
                          const std::vector<int64_t>& recv_rows) override {
    const FlightScope in_flight = flight("all_to_all_v", t);
    check_cuda(t, "all_to_all_v");
    const Timed timer = timed("all_to_all_v");
    const int64_t row_bytes = row_bytes_for_all_to_all_v(t, send_rows, recv_rows, rank_, size_, "nccl");
    at::Tensor x = t.contiguous();
    at::Tensor out = received_empty(x, recv_rows);
    const auto type = nccl_dtype(x.scalar_type(), "all_to_all_v");
    const int64_t row = row_bytes / static_cast<int64_t>(x.element_size());  // elements per row
    auto* src = static_cast<char*>(x.data_ptr());
    auto* dst = static_cast<char*>(out.data_ptr());
    cudaStream_t s = stream(x);
    ok(ncclGroupStart(), "all_to_all_v(group_start)");
    int64_t so = 0, ro = 0;
    for (int peer = 0; peer < size_; ++peer) {
      if (send_rows[peer] > 0)
        ok(ncclSend(src + so * row_bytes, send_rows[peer] * row, type, peer, comm_, s), "all_to_all_v(send)");
      if (recv_rows[peer] > 0)
        ok(ncclRecv(dst + ro * row_bytes, recv_rows[peer] * row, type, peer, comm_, s), "all_to_all_v(recv)");
      so += send_rows[peer];
      ro += recv_rows[peer];
    }
    ok(ncclGroupEnd(), "all_to_all_v(group_end)");
    count("all_to_all_v", t.nbytes(), t.scalar_type());
    return out;
  }

  void barrier() override {
    const FlightScope in_flight = flight("barrier", at::Tensor());
    at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    ok(ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, stream(one)), "barrier");
    const cudaError_t rc = cudaStreamSynchronize(stream(one));
    MT_CHECK(rc == cudaSuccess, "nccl barrier on rank ", rank_, ": ", cudaGetErrorString(rc));
    count("barrier", 0);
  }

 private:
  void ok(ncclResult_t rc, const char* op) const {
    if (rc == ncclSuccess) return;
    MT_FAIL("nccl ", op, " failed on rank ", rank_, " of ", size_, ": ", ncclGetErrorString(rc),
            rc == ncclSystemError || rc == ncclRemoteError ? " (see NCCL_DEBUG=WARN for details)" : "");
  }

  void check_cuda(const at::Tensor& t, const char* op) const {
    check_tensor(t, t.defined() && t.device().is_cuda(), "nccl", op, rank_,
                 "the NCCL backend serves CUDA tensors (use cpu_world() for CPU tensors)");
  }
  void check_peer(int peer, const char* op, const char* what) const {
    meshtrain::check_peer(peer, size_, "nccl", op, rank_, what);
  }

  // Work runs on torch's current stream so it orders with the kernels that
  // produced and will consume the tensor, and the caching allocator's reuse of
  // temporaries stays safe.
  static cudaStream_t stream(const at::Tensor& t) {
#ifdef MESHTRAIN_CUDA
    return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
    (void)t;
    return nullptr;
#endif
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> nccl_communicator(Communicator& bootstrap) {
  return std::make_unique<NcclCommunicator>(bootstrap);
}

std::string nccl_runtime_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes MAJOR*10000 + MINOR*100 + PATCH.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

}  // namespace meshtrain

#else  // !MESHTRAIN_HAVE_NCCL

namespace meshtrain {

std::unique_ptr<Communicator> nccl_communicator(Communicator& bootstrap) {
  MT_FAIL("nccl backend requested on rank ", bootstrap.rank(),
          " but meshtrain was built without NCCL (nccl.h not found at configure time); "
          "use the mpi backend or rebuild on a machine with CUDA and NCCL");
}

std::string nccl_runtime_version() { return ""; }

}  // namespace meshtrain

#endif
