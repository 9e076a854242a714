#pragma once
// Communicator: the collectives meshtrain needs, on tensors. The MPI backend
// serves CPU tensors, the NCCL backend CUDA tensors (on the current stream).
// MPI and NCCL headers never appear here: backends live in src/dist/*.cpp.
//
// Byte accounting (for tests that compare traffic with theory): each call adds
// the payload this rank hands to the collective, in bytes, as it travels
// (every float dtype in its own size: a bf16 all-reduce counts 2 bytes an
// element, half of fp32; bools are reduced as int32, 4 bytes an element):
//   all_reduce: t.nbytes()          all_gather: output nbytes (size * input)
//   reduce_scatter: input nbytes    broadcast: t.nbytes()
//   send / recv: t.nbytes()         all_to_all: input nbytes   barrier: 0
//   send_recv: t.nbytes() as a send, r.nbytes() as a recv
//   all_to_all_v: input nbytes (every row of t, the block kept by this rank included)
//   gather: the root its output nbytes (size * input), the others input nbytes
// and, the same bytes, by the payload's dtype (bytes_by_dtype).
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/flight_recorder.h"

namespace meshtrain {

enum class ReduceOp { Sum, Max, Min };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi" | "nccl"

  // In place; every rank ends with the reduction of all ranks' t.
  virtual void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // Concatenation of every rank's t along dim, in rank order.
  virtual at::Tensor all_gather(const at::Tensor& t, int64_t dim = 0) = 0;
  // Sum over ranks, then this rank keeps chunk rank() of `dim` (size must divide it).
  virtual at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim = 0) = 0;
  virtual void broadcast(at::Tensor& t, int root) = 0;
  // Concatenation of every rank's t along dim 0, in rank order, on `root`
  // only (checkpoints: one writer receives, no rank holds what it does not
  // write); other ranks get an undefined tensor. Every rank's t must have the
  // same shape and dtype.
  virtual at::Tensor gather(const at::Tensor& t, int root) = 0;
  virtual void send(const at::Tensor& t, int dst, int tag = 0) = 0;
  virtual void recv(at::Tensor& t, int src, int tag = 0) = 0;
  // Sends t to dst and receives r from src as one operation (MPI_Sendrecv;
  // one NCCL group): neither half waits for the other, so it completes
  // whenever a send followed by a recv (or the reverse) would, and sooner.
  // The pipeline pairs its adjacent transfers with it.
  virtual void send_recv(const at::Tensor& t, int dst, at::Tensor& r, int src, int send_tag = 0,
                         int recv_tag = 0) = 0;
  // dim 0 of t is split in size() equal chunks; chunk j goes to rank j; the
  // result stacks the chunks received from ranks 0..size-1 along dim 0.
  virtual at::Tensor all_to_all(const at::Tensor& t) = 0;
  // Uneven all-to-all (expert parallelism's token exchange): t's rows (dim 0)
  // are size() consecutive blocks, block j of send_rows[j] rows going to rank
  // j; the result stacks the blocks received from ranks 0..size-1 along dim 0,
  // recv_rows[j] rows from rank j. recv_rows[j] must equal rank j's
  // send_rows[rank()] (exchange the counts first); the other dims and the
  // dtype must agree on every rank.
  virtual at::Tensor all_to_all_v(const at::Tensor& t, const std::vector<int64_t>& send_rows,
                                  const std::vector<int64_t>& recv_rows) = 0;
  virtual void barrier() = 0;

  int64_t bytes_moved() const { return bytes_total_; }
  const std::map<std::string, int64_t>& bytes_by_op() const { return bytes_by_op_; }
  // The same bytes by the payload's dtype, named as c10 names it ("Float",
  // "BFloat16", "Long", "Int": a bool all-reduce travels as Int).
  const std::map<std::string, int64_t>& bytes_by_dtype() const { return bytes_by_dtype_; }
  // Wall seconds spent per op, for the ops that time themselves (the
  // all-to-alls: bench's all-to-all share; every op of a host-staged
  // communicator). On NCCL the time to enqueue them: the device work runs on.
  const std::map<std::string, double>& seconds_by_op() const { return seconds_by_op_; }
  // Reports every op to `recorder` as its axis `axis` (core/flight_recorder.h,
  // set by the Mesh); null: not recorded.
  void record_flight(FlightRecorder* recorder, int axis) {
    flight_ = recorder;
    flight_axis_ = axis;
  }
  FlightRecorder* flight_recorder() const { return flight_; }
  int flight_axis() const { return flight_axis_; }

  void reset_bytes() {
    bytes_total_ = 0;
    bytes_by_op_.clear();
    bytes_by_dtype_.clear();
    seconds_by_op_.clear();
  }

 protected:
  // Every backend op opens one for its duration: `FlightScope f = flight("all_reduce", t);`.
  // peer: the other rank of a send/recv, the root of a gather/broadcast.
  FlightScope flight(const char* op, const at::Tensor& t, int peer = -1) const {
    if (!flight_) return FlightScope(nullptr, 0, op, "", peer, 0);
    return FlightScope(flight_, flight_axis_, op, t.defined() ? c10::toString(t.scalar_type()) : "",
                       peer, t.defined() ? static_cast<int64_t>(t.nbytes()) : 0);
  }
  void count(const char* op, int64_t bytes) {
    bytes_total_ += bytes;
    bytes_by_op_[op] += bytes;
  }
  void count(const char* op, int64_t bytes, at::ScalarType dtype) {
    count(op, bytes);
    add_dtype_bytes(c10::toString(dtype), bytes);
  }
  void add_dtype_bytes(const std::string& dtype, int64_t bytes) {
    if (bytes != 0) bytes_by_dtype_[dtype] += bytes;
  }
  void add_seconds(const char* op, double s) { seconds_by_op_[op] += s; }
  // Adds the host seconds from here to the end of the scope to op's.
  class Timed {
   public:
    Timed(Communicator* c, const char* op) : c_(c), op_(op), t0_(std::chrono::steady_clock::now()) {}
    ~Timed() { c_->add_seconds(op_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count()); }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    Communicator* c_;
    const char* op_;
    std::chrono::steady_clock::time_point t0_;
  };
  Timed timed(const char* op) { return Timed(this, op); }

 private:
  int64_t bytes_total_ = 0;
  std::map<std::string, int64_t> bytes_by_op_, bytes_by_dtype_;
  std::map<std::string, double> seconds_by_op_;
  FlightRecorder* flight_ = nullptr;
  int flight_axis_ = 0;
};

}  // namespace meshtrain
