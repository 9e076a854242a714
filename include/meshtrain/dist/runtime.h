#pragma once
// Runtime: the process's MPI world. Created once by main (MPI_Init_thread) and
// passed down; works as a single process without mpirun. Not a singleton.
#include <memory>
#include <string>

#include "meshtrain/dist/comm.h"

namespace meshtrain {

class Runtime {
 public:
  Runtime(int* argc, char*** argv);
  ~Runtime();  // MPI_Finalize
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This process among the ranks on its host (MPI_COMM_TYPE_SHARED): picks its GPU.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // Aborts every rank of the world (after an error on one of them).
  [[noreturn]] void abort(int code) const;

  // A CPU (MPI) communicator over the whole world.
  std::unique_ptr<Communicator> world() const;

 private:
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool owns_mpi_ = false;  // finalize only an MPI that this Runtime initialised
};

}  // namespace meshtrain
