// Mesh: (dp, pp, tp) coordinates and per-axis communicators; see meshtrain/dist/mesh.h.
#include "meshtrain/dist/mesh.h"

#include <torch/torch.h>

#include "backends.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

std::string describe(const MeshShape& s) {
  if (s.cp > 1 && s.dp % s.cp == 0)
    return detail::concat("n_device_axis [dp,pp,tp]=[", s.dp / s.cp, ",", s.pp, ",", s.tp, "] x context_parallel ",
                          s.cp);
  return detail::concat("n_device_axis [dp,pp,tp]=[", s.dp, ",", s.pp, ",", s.tp, "]");
}

void check_shape(const MeshShape& s) {
  MT_CHECK(s.dp >= 1 && s.pp >= 1 && s.tp >= 1, describe(s), ": every axis must be at least 1");
  MT_CHECK(s.ep >= 1 && s.dp % s.ep == 0, "device_config.expert_parallel = ", s.ep, " must be >= 1 and divide dp = ",
           s.dp, " (", describe(s), ")");
  MT_CHECK(s.cp >= 1 && s.dp % s.cp == 0, "device_config.context_parallel = ", s.cp,
           " must be >= 1 and divide the mesh's dp ranks = ", s.dp, " (", describe(s), ")");
}

}  // namespace

MeshCoord coord_of(const MeshShape& shape, int rank) {
  check_shape(shape);
  MT_CHECK(rank >= 0 && rank < shape.world(), "coord_of: rank ", rank, " is outside ", describe(shape),
           " (", shape.world(), " ranks)");
  MeshCoord c;
  c.tp = rank % shape.tp;
  c.dp = (rank / shape.tp) % shape.dp;
  c.pp = rank / (shape.tp * shape.dp);
  return c;
}

int rank_of(const MeshShape& shape, const MeshCoord& c) {
  check_shape(shape);
  MT_CHECK(c.dp >= 0 && c.dp < shape.dp && c.pp >= 0 && c.pp < shape.pp && c.tp >= 0 && c.tp < shape.tp,
           "rank_of: coord (dp=", c.dp, ", pp=", c.pp, ", tp=", c.tp, ") is outside ", describe(shape));
  return (c.pp * shape.dp + c.dp) * shape.tp + c.tp;
}

std::unique_ptr<Communicator> split_communicator(const Communicator& parent, int color, int key) {
  return mpi_split(parent, color, key);
}

Mesh::Mesh(const Runtime& runtime, MeshShape shape, Backend backend)
    : Mesh(*runtime.world(), shape, backend) {}

Mesh::Mesh(const Communicator& parent, MeshShape shape, Backend backend) : shape_(shape) {
  check_shape(shape_);
  MT_CHECK(shape_.world() == parent.size(), describe(shape_), " needs ", shape_.world(),
           " ranks but the world has ", parent.size(), " (mpirun -np ", parent.size(),
           "); set n_device_axis so that dp*pp*tp (x context_parallel) equals the number of processes");
  rank_ = parent.rank();
  coord_ = coord_of(shape_, rank_);

  cpu_world_ = mpi_split(parent, 0, rank_);
  // Key = the axis coordinate, so rank() within each axis equals the coordinate.
  auto dp = mpi_split(*cpu_world_, coord_.pp * shape_.tp + coord_.tp, coord_.dp);
  auto pp = mpi_split(*cpu_world_, coord_.dp * shape_.tp + coord_.tp, coord_.pp);
  auto tp = mpi_split(*cpu_world_, coord_.pp * shape_.dp + coord_.dp, coord_.tp);
  // ep groups: consecutive dp ranks (neighbours on the network); expert-dp: same dp % ep.
  const int ep = shape_.ep, outer = (coord_.pp * shape_.tp + coord_.tp) * shape_.dp;
  auto eps = mpi_split(*cpu_world_, outer + coord_.dp / ep, coord_.dp % ep);
  auto edp = mpi_split(*cpu_world_, outer + coord_.dp % ep, coord_.dp / ep);
  // cp groups: consecutive dp ranks too (one batch share, next to each other).
  auto cps = mpi_split(*cpu_world_, outer + coord_.dp / shape_.cp, coord_.dp % shape_.cp);

  if (backend == Backend::Mpi) {
    // Staged, so CUDA tensors work too (collectives "mpi"); CPU tensors pass through.
    dp_ = host_staged(std::move(dp));
    pp_ = host_staged(std::move(pp));
    tp_ = host_staged(std::move(tp));
    ep_ = host_staged(std::move(eps));
    edp_ = host_staged(std::move(edp));
    cp_ = host_staged(std::move(cps));
  } else {
    // Every rank creates the three NCCL communicators in the same order; each
    // init only waits for the members of its own group, so this cannot deadlock.
    // No world-wide NCCL communicator: world traffic is control data on cpu_world.
    dp_ = nccl_communicator(*dp);
    pp_ = nccl_communicator(*pp);
    tp_ = nccl_communicator(*tp);
    // Without expert parallelism the ep group is this rank alone and
    // expert_dp() is dp: no NCCL communicators for them.
    ep_ = ep > 1 ? nccl_communicator(*eps) : host_staged(std::move(eps));
    edp_ = ep > 1 ? nccl_communicator(*edp) : host_staged(std::move(edp));
    cp_ = shape_.cp > 1 ? nccl_communicator(*cps) : host_staged(std::move(cps));
  }
  // Setup traffic (unique-id broadcasts) is not training traffic.
  cpu_world_->reset_bytes();
}

Mesh::~Mesh() = default;

void Mesh::record_flight(FlightRecorder& recorder) {
  // The group of each axis: the same color as its split above, so ranks of
  // one group share it (core/flight_compare.h compares within a group).
  const int ep = shape_.ep, outer = (coord_.pp * shape_.tp + coord_.tp) * shape_.dp;
  const auto add = [&](Communicator& c, const char* name, int group) {
    c.record_flight(&recorder, recorder.add_axis(name, group, c.rank(), c.size()));
  };
  add(*cpu_world_, "world", 0);
  add(*dp_, "dp", coord_.pp * shape_.tp + coord_.tp);
  add(*pp_, "pp", coord_.dp * shape_.tp + coord_.tp);
  add(*tp_, "tp", coord_.pp * shape_.dp + coord_.dp);
  add(*ep_, "ep", outer + coord_.dp / ep);
  add(*edp_, "expert_dp", outer + coord_.dp % ep);
  add(*cp_, "cp", outer + coord_.dp / shape_.cp);
}

int64_t Mesh::bytes_moved() const {
  return dp_->bytes_moved() + pp_->bytes_moved() + tp_->bytes_moved() + ep_->bytes_moved() + edp_->bytes_moved() +
         cp_->bytes_moved();
}

void Mesh::reset_bytes() {
  dp_->reset_bytes();
  pp_->reset_bytes();
  tp_->reset_bytes();
  ep_->reset_bytes();
  edp_->reset_bytes();
  cp_->reset_bytes();
}

}  // namespace meshtrain
