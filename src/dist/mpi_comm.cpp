// MPI backend of Communicator: CPU tensors over an MPI communicator.
// C bindings only: OpenMPI's deprecated C++ bindings need libmpi_cxx, which we do not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <torch/torch.h>

#include <climits>
#include <string>
#include <vector>

#include "backends.h"
#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

int world_rank() {
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// With MPI_ERRORS_RETURN set on our communicators every failure comes back as a
// code; turning it into an exception lets main abort all ranks cleanly.
void check_mpi(int rc, const char* op, int rank, int size) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  MT_FAIL("mpi ", op, " failed on rank ", rank, " of ", size, " (world rank ", world_rank(),
          "): ", std::string(text, len));
}

// MPI counts are int; a tensor of 2 GiB or more in one call needs splitting,
// which nothing in meshtrain does on CPU yet, so say so instead of overflowing.
int to_count(int64_t n, const char* op) {
  MT_CHECK(n <= INT_MAX, "mpi ", op, ": ", n, " elements/bytes exceed MPI's int count; split the tensor");
  return static_cast<int>(n);
}

MPI_Datatype mpi_dtype(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    default: MT_FAIL("mpi ", op, ": dtype ", t, " cannot be reduced");
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

int64_t norm_dim(const at::Tensor& t, int64_t dim, const char* op) { return meshtrain::norm_dim(t, dim, "mpi", op); }

// MPI has no 16-bit float types: bf16/fp16 travel as MPI_UINT16_T under these
// user-defined ops, which combine each pair through float and round back to
// the 16-bit type, one rounding per add as NCCL's bf16 kernels do. a + b is
// commutative bit for bit, so every rank ends with the same bits. For two
// ranks the result equals an fp32 sum cast back (the sum of two bf16 is
// exact in fp32); for more, the sum is rounded after each add.
template <class T, ReduceOp kOp>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    float r = x + y;
    if (kOp == ReduceOp::Max) r = x > y || x != x ? x : y;  // NaN wins, as in MPI_MAX on floats
    if (kOp == ReduceOp::Min) r = x < y || x != x ? x : y;
    b[i] = static_cast<T>(r);
  }
}

// The six 16-bit ops, created once per communicator (an MPI_Op must be
// created after MPI_Init and freed before MPI_Finalize, like the communicator).
class SixteenBitOps {
 public:
  SixteenBitOps() {
    make<c10::BFloat16>(0);
    make<c10::Half>(3);
  }
  ~SixteenBitOps() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Op& op : ops_)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  }
  SixteenBitOps(const SixteenBitOps&) = delete;
  SixteenBitOps& operator=(const SixteenBitOps&) = delete;

  // The op for `dtype` (kBFloat16 or kHalf) and `op`.
  MPI_Op get(at::ScalarType dtype, ReduceOp op) const {
    return ops_[(dtype == at::kHalf ? 3 : 0) + static_cast<int>(op)];
  }

 private:
  template <class T>
  void make(int base) {
    MPI_Op_create(&reduce_16bit<T, ReduceOp::Sum>, /*commute=*/1, &ops_[base + static_cast<int>(ReduceOp::Sum)]);
    MPI_Op_create(&reduce_16bit<T, ReduceOp::Max>, 1, &ops_[base + static_cast<int>(ReduceOp::Max)]);
    MPI_Op_create(&reduce_16bit<T, ReduceOp::Min>, 1, &ops_[base + static_cast<int>(ReduceOp::Min)]);
  }
  MPI_Op ops_[6] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

bool is_16bit_float(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor).
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  MPI_Comm handle() const { return comm_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    const FlightScope in_flight = flight("all_reduce", t);
    check_cpu(t, "all_reduce");
    at::Tensor w = t.to(reduction_dtype(t.scalar_type())).contiguous();
    ok(MPI_Allreduce(MPI_IN_PLACE, w.data_ptr(), to_count(w.numel(), "all_reduce"), type_of(w, "all_reduce"),
                     op_of(w, op), comm_),
       "all_reduce");
    if (!w.is_same(t)) t.copy_(w);
    count("all_reduce", w.nbytes(), w.scalar_type());
  }

  at::Tensor all_gather(const at::Tensor& t, int64_t dim) override {
    const FlightScope in_flight = flight("all_gather", t);
    check_cpu(t, "all_gather");
    const int64_t d = norm_dim(t, dim, "all_gather");
    at::Tensor x = t.contiguous();
    at::Tensor out = stacked_empty(x, size_);
    const int n = to_count(x.nbytes(), "all_gather");
    ok(MPI_Allgather(x.data_ptr(), n, MPI_BYTE, out.data_ptr(), n, MPI_BYTE, comm_), "all_gather");
    count("all_gather", out.nbytes(), out.scalar_type());
    return merge_blocks(out, d);
  }

  at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim) override {
    const FlightScope in_flight = flight("reduce_scatter", t);
    check_cpu(t, "reduce_scatter");
    at::Tensor x = chunks_first(t, norm_dim(t, dim, "reduce_scatter"), size_, "mpi");
    at::Tensor out = at::empty(x.sizes().slice(1), x.options());
    ok(MPI_Reduce_scatter_block(x.data_ptr(), out.data_ptr(), to_count(out.numel(), "reduce_scatter"),
                                type_of(x, "reduce_scatter"), op_of(x, ReduceOp::Sum), comm_),
       "reduce_scatter");
    count("reduce_scatter", x.nbytes(), x.scalar_type());
    return out.to(t.scalar_type());
  }

  void broadcast(at::Tensor& t, int root) override {
    const FlightScope in_flight = flight("broadcast", t, root);
    check_cpu(t, "broadcast");
    check_peer(root, "broadcast", "root");
    at::Tensor w = t.contiguous();
    ok(MPI_Bcast(w.data_ptr(), to_count(w.nbytes(), "broadcast"), MPI_BYTE, root, comm_), "broadcast");
    if (!w.is_same(t)) t.copy_(w);
    count("broadcast", t.nbytes(), t.scalar_type());
  }

  at::Tensor gather(const at::Tensor& t, int root) override {
    const FlightScope in_flight = flight("gather", t, root);
    check_cpu(t, "gather");
    check_peer(root, "gather", "root");
    MT_CHECK(t.dim() > 0, "mpi gather on rank ", rank_, ": needs a tensor with at least one dim, got a scalar");
    at::Tensor x = t.contiguous();
    const int n = to_count(x.nbytes(), "gather");
    at::Tensor out;
    if (rank_ == root) out = gathered_empty(x, size_);
    ok(MPI_Gather(x.data_ptr(), n, MPI_BYTE, rank_ == root ? out.data_ptr() : nullptr, n, MPI_BYTE, root, comm_),
       "gather");
    count("gather", rank_ == root ? static_cast<int64_t>(out.nbytes()) : static_cast<int64_t>(x.nbytes()),
          x.scalar_type());
    return out;
  }

  void send(const at::Tensor& t, int dst, int tag) override {
    const FlightScope in_flight = flight("send", t, dst);
    check_cpu(t, "send");
    check_peer(dst, "send", "dst");
    at::Tensor x = t.contiguous();
    ok(MPI_Send(x.data_ptr(), to_count(x.nbytes(), "send"), MPI_BYTE, dst, tag, comm_), "send");
    count("send", t.nbytes(), t.scalar_type());
  }

  void recv(at::Tensor& t, int src, int tag) override {
    const FlightScope in_flight = flight("recv", t, src);
    check_cpu(t, "recv");
    check_peer(src, "recv", "src");
    at::Tensor w = t.contiguous();
    MPI_Status status;
    ok(MPI_Recv(w.data_ptr(), to_count(w.nbytes(), "recv"), MPI_BYTE, src, tag, comm_, &status), "recv");
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    MT_CHECK(got == static_cast<int64_t>(w.nbytes()), "mpi recv on rank ", rank_, " from rank ", src,
             " (tag ", tag, "): expected ", w.nbytes(), " bytes for shape ", t.sizes(), " ", t.scalar_type(),
             " but got ", got, " (sender and receiver disagree on shape or dtype)");
    if (!w.is_same(t)) t.copy_(w);
    count("recv", t.nbytes(), t.scalar_type());
  }

  void send_recv(const at::Tensor& t, int dst, at::Tensor& r, int src, int send_tag, int recv_tag) override {
    const FlightScope in_flight = flight("send_recv", t, dst);
    check_cpu(t, "send_recv");
    check_cpu(r, "send_recv");
    check_peer(dst, "send_recv", "dst");
    check_peer(src, "send_recv", "src");
    at::Tensor x = t.contiguous();
    at::Tensor w = r.contiguous();
    MPI_Status status;
    ok(MPI_Sendrecv(x.data_ptr(), to_count(x.nbytes(), "send_recv"), MPI_BYTE, dst, send_tag, w.data_ptr(),
                    to_count(w.nbytes(), "send_recv"), MPI_BYTE, src, recv_tag, comm_, &status),
       "send_recv");
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    MT_CHECK(got == static_cast<int64_t>(w.nbytes()), "mpi send_recv on rank ", rank_, " from rank ", src,
             " (tag ", recv_tag, "): expected ", w.nbytes(), " bytes for shape ", r.sizes(), " ", r.scalar_type(),
             " but got ", got, " (sender and receiver disagree on shape or dtype)");
    if (!w.is_same(r)) r.copy_(w);
    count("send", t.nbytes(), t.scalar_type());
    count("recv", r.nbytes(), r.scalar_type());
  }

  at::Tensor all_to_all(const at::Tensor& t) override {
    const FlightScope in_flight = flight("all_to_all", t);
    check_cpu(t, "all_to_all");
    const Timed timer = timed("all_to_all");
    check_all_to_all(t, size_, "mpi");
    at::Tensor x = t.contiguous();
    at::Tensor out = at::empty_like(x);
    const int n = to_count(x.nbytes() / size_, "all_to_all");
    ok(MPI_Alltoall(x.data_ptr(), n, MPI_BYTE, out.data_ptr(), n, MPI_BYTE, comm_), "all_to_all");
    count("all_to_all", t.nbytes(), t.scalar_type());
    return out;
  }

  at::Tensor all_to_all_v(const at::Tensor& t, const std::vector<int64_t>& send_rows,
                          const std::vector<int64_t>& recv_rows) override {
    const FlightScope in_flight = flight("all_to_all_v", t);
    check_cpu(t, "all_to_all_v");
    const Timed timer = timed("all_to_all_v");
    const int64_t row = row_bytes_for_all_to_all_v(t, send_rows, recv_rows, rank_, size_, "mpi");
    at::Tensor x = t.contiguous();
    at::Tensor out = received_empty(x, recv_rows);
    // Byte counts and displacements: MPI's are int, so each is checked.
    std::vector<int> scount(size_), sdispl(size_), rcount(size_), rdispl(size_);
    int64_t so = 0, ro = 0;
    for (int j = 0; j < size_; ++j) {
      scount[j] = to_count(send_rows[j] * row, "all_to_all_v");
      sdispl[j] = to_count(so, "all_to_all_v");
      rcount[j] = to_count(recv_rows[j] * row, "all_to_all_v");
      rdispl[j] = to_count(ro, "all_to_all_v");
      so += send_rows[j] * row;
      ro += recv_rows[j] * row;
    }
    ok(MPI_Alltoallv(x.data_ptr(), scount.data(), sdispl.data(), MPI_BYTE, out.data_ptr(), rcount.data(),
                     rdispl.data(), MPI_BYTE, comm_),
       "all_to_all_v");
    count("all_to_all_v", t.nbytes(), t.scalar_type());
    return out;
  }

  void barrier() override {
    const FlightScope in_flight = flight("barrier", at::Tensor());
    ok(MPI_Barrier(comm_), "barrier");
    count("barrier", 0);
  }

 private:
  void ok(int rc, const char* op) const { check_mpi(rc, op, rank_, size_); }

  // The MPI type and op reducing `t`: 16-bit floats as uint16 under our ops.
  static MPI_Datatype type_of(const at::Tensor& t, const char* op) {
    return is_16bit_float(t.scalar_type()) ? MPI_UINT16_T : mpi_dtype(t.scalar_type(), op);
  }
  MPI_Op op_of(const at::Tensor& t, ReduceOp op) const {
    return is_16bit_float(t.scalar_type()) ? ops16_.get(t.scalar_type(), op) : mpi_op(op);
  }

  void check_cpu(const at::Tensor& t, const char* op) const {
    check_tensor(t, t.defined() && t.device().is_cpu(), "mpi", op, rank_,
                 "the MPI backend serves CPU tensors (use the NCCL backend for CUDA)");
  }
  void check_peer(int peer, const char* op, const char* what) const {
    meshtrain::check_peer(peer, size_, "mpi", op, rank_, what);
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  SixteenBitOps ops16_;
};

}  // namespace

std::unique_ptr<Communicator> mpi_world_communicator() {
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "comm_dup(world)", world_rank(), -1);
  return std::make_unique<MpiCommunicator>(dup);
}

std::unique_ptr<Communicator> mpi_split(const Communicator& parent, int color, int key) {
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&parent);
  MT_ASSERT(mpi != nullptr, "mpi_split needs an MPI parent, got backend ", parent.backend());
  MPI_Comm out = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(mpi->handle(), color, key, &out), "comm_split", parent.rank(), parent.size());
  return std::make_unique<MpiCommunicator>(out);
}

}  // namespace meshtrain
