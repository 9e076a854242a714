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

namespace {

ThreadLevel from_mpi(int level) {
  if (level >= MPI_THREAD_MULTIPLE) return ThreadLevel::Multiple;
  if (level >= MPI_THREAD_SERIALIZED) return ThreadLevel::Serialized;
  if (level >= MPI_THREAD_FUNNELED) return ThreadLevel::Funneled;
  return ThreadLevel::Single;
}

int to_mpi(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::Single: return MPI_THREAD_SINGLE;
    case ThreadLevel::Funneled: return MPI_THREAD_FUNNELED;
    case ThreadLevel::Serialized: return MPI_THREAD_SERIALIZED;
    case ThreadLevel::Multiple: return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_MULTIPLE;
}

}  // namespace

const char* thread_level_name(ThreadLevel l) {
  switch (l) {
    case ThreadLevel::Single: return "MPI_THREAD_SINGLE";
    case ThreadLevel::Funneled: return "MPI_THREAD_FUNNELED";
    case ThreadLevel::Serialized: return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::Multiple: return "MPI_THREAD_MULTIPLE";
  }
  return "MPI_THREAD_?";
}

void require_thread_level(ThreadLevel needed, ThreadLevel provided) {
  MT_CHECK(static_cast<int>(provided) >= static_cast<int>(needed), "Runtime: meshtrain asked MPI for ",
           thread_level_name(needed), " but this MPI provides only ", thread_level_name(provided),
           ": collectives also run on autograd's backward thread, one call at a time. Use an MPI built with "
           "thread support (OpenMPI >= 3 provides it by default; check `ompi_info | grep -i thread` for "
           "'MPI_THREAD_MULTIPLE: yes'), or, when another library initialised MPI first, have it call "
           "MPI_Init_thread with ",
           thread_level_name(needed), " or higher");
}

Runtime::Runtime(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  MT_CHECK(!finalized, "Runtime: MPI was already finalized in this process; it cannot be restarted");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // kNeededThreadLevel (runtime.h) says why SERIALIZED. Without mpirun
    // OpenMPI starts a singleton world of one rank.
    const int rc = MPI_Init_thread(argc, argv, to_mpi(kNeededThreadLevel), &provided);
    MT_CHECK(rc == MPI_SUCCESS, "Runtime: MPI_Init_thread failed with code ", rc,
             " (is OpenMPI installed and, under mpirun, are all ranks started?)");
    owns_mpi_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  thread_level_ = from_mpi(provided);
  try {
    require_thread_level(kNeededThreadLevel, thread_level_);
  } catch (...) {
    // Every rank refuses alike; leave MPI as we found it (no destructor runs).
    if (owns_mpi_) MPI_Finalize();
    throw;
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
