// Runtime: MPI init/finalize and the world; see meshtrain/dist/runtime.h.
#include "meshtrain/dist/runtime.h"

// C bindings only: OpenMPI's deprecated C++ bindings need libmpi_cxx, which we do not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <torch/torch.h>

#include <cstdlib>

#include "backends.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

Runtime::Runtime(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  MT_CHECK(!finalized, "Runtime: MPI was already finalized in this process; it cannot be restarted");
  if (!initialized) {
    // Only the main thread calls MPI (data loader threads never do), so
    // FUNNELED is enough and avoids the cost of full thread safety. Without
    // mpirun OpenMPI starts a singleton world of one rank.
    int provided = 0;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MT_CHECK(rc == MPI_SUCCESS, "Runtime: MPI_Init_thread failed with code ", rc,
             " (is OpenMPI installed and, under mpirun, are all ranks started?)");
    owns_mpi_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  // The ranks sharing this host's memory are the ranks sharing its GPUs.
  MPI_Comm node = MPI_COMM_NULL;
  const int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MT_CHECK(rc == MPI_SUCCESS && node != MPI_COMM_NULL, "Runtime: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed on rank ",
           rank_, " with code ", rc);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
}

Runtime::~Runtime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

void Runtime::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  // MPI_Abort is not declared noreturn; never fall back into the caller.
  std::abort();
}

std::unique_ptr<Communicator> Runtime::world() const { return mpi_world_communicator(); }

}  // namespace meshtrain
