#pragma once
// Mesh: world ranks <-> (dp, pp, tp) coordinates and one communicator per axis.
// Rank order: tp fastest, then dp, then pp (tp peers share a host):
//   rank = (pp_rank * dp + dp_rank) * tp + tp_rank
#include <array>
#include <memory>
#include <string>

#include "meshtrain/dist/comm.h"
#include "meshtrain/dist/runtime.h"

namespace meshtrain {

// Mpi: MPI communicators that also take CUDA tensors, staged through pinned
// host memory (ranks may share a GPU). Nccl: NCCL, CUDA tensors only.
enum class Backend { Mpi, Nccl };

// ep (expert parallelism, device_config.expert_parallel) divides dp: the
// routed experts are split over ep consecutive dp ranks (an "ep group"); the
// dp ranks holding the same experts (dp / ep of them, same dp % ep) form the
// "expert-dp" group over which expert gradients are summed. ep adds no ranks.
//
// cp (context parallelism, device_config.context_parallel) divides dp too:
// dp counts the ranks that hold the same parameters, which under cp are the
// data-parallel replicas times cp. Gradients, ZeRO shards, FSDP and ep groups
// span all of them (as Megatron's dp-cp group); only the data differ: the cp
// consecutive dp ranks of a "cp group" read the same sequences and each keeps
// its two chunks of them (parallel/context_parallel.h).
struct MeshShape {
  int dp = 1, pp = 1, tp = 1;
  int ep = 1;
  int cp = 1;
  int world() const { return dp * pp * tp; }
  // Data-parallel replicas: the number of different batches.
  int data_dp() const { return dp / cp; }
};

struct MeshCoord {
  int dp = 0, pp = 0, tp = 0;
};

// Splits an MPI communicator (MPI_Comm_split): ranks with the same color form
// one group, ordered by key.
std::unique_ptr<Communicator> split_communicator(const Communicator& parent, int color, int key);

MeshCoord coord_of(const MeshShape& shape, int rank);
int rank_of(const MeshShape& shape, const MeshCoord& c);

class Mesh {
 public:
  // Checks shape.world() == runtime.size() (error names n_device_axis), then
  // splits the world into per-axis communicators of the given backend.
  Mesh(const Runtime& runtime, MeshShape shape, Backend backend = Backend::Mpi);
  // The same over a sub-world (an MPI communicator, e.g. from split_communicator):
  // tests run a 1x1x1 reference inside each rank of a multi-rank job.
  Mesh(const Communicator& parent, MeshShape shape, Backend backend = Backend::Mpi);
  ~Mesh();

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return rank_; }

  Communicator& dp() { return *dp_; }
  Communicator& pp() { return *pp_; }
  Communicator& tp() { return *tp_; }
  // The ep group (same pp, tp and dp / ep): rank() is ep_rank(). Size 1 when ep is 1.
  Communicator& ep() { return *ep_; }
  // The dp ranks holding the same experts (same pp, tp and dp % ep); dp itself when ep is 1.
  Communicator& expert_dp() { return shape_.ep > 1 ? *edp_ : *dp_; }
  // Which slice of the routed experts this rank holds: dp % ep.
  int ep_rank() const { return coord_.dp % shape_.ep; }
  // The cp group (same pp, tp and dp / cp): rank() is cp_rank(). Size 1 without cp.
  Communicator& cp() { return *cp_; }
  int cp_rank() const { return coord_.dp % shape_.cp; }
  // Which batch share this rank reads: dp / cp (the loaders' dp rank).
  int data_rank() const { return coord_.dp / shape_.cp; }
  // "mpi" or "nccl": the backend of the three axis communicators.
  std::string backend() const { return dp_->backend(); }
  // Host-side (MPI, CPU tensors) world communicator for control messages such
  // as "stop requested" or a checksum, whatever the backend of the others.
  Communicator& cpu_world() { return *cpu_world_; }

  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == shape_.pp - 1; }

  // Every communicator of the mesh (cpu_world as "world", dp, pp, tp, ep,
  // expert_dp, cp) reports its ops to `recorder` from now on (core/flight_recorder.h).
  void record_flight(FlightRecorder& recorder);

  // Total bytes moved by the axis communicators, ep, expert-dp and cp included (for traffic tests).
  int64_t bytes_moved() const;
  void reset_bytes();

 private:
  MeshShape shape_;
  MeshCoord coord_;
  int rank_ = 0;
  std::unique_ptr<Communicator> dp_, pp_, tp_, ep_, edp_, cp_, cpu_world_;
};

}  // namespace meshtrain
