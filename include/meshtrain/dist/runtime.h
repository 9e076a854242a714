#pragma once
// Runtime: the process's MPI world. Created once by main (MPI_Init_thread) and
// passed down; works as a single process without mpirun. Not a singleton.
#include <memory>
#include <string>

#include "meshtrain/dist/comm.h"

namespace meshtrain {

// MPI's thread support levels, in MPI's order (MPI_THREAD_SINGLE < FUNNELED <
// SERIALIZED < MULTIPLE), without mpi.h.
enum class ThreadLevel { Single = 0, Funneled = 1, Serialized = 2, Multiple = 3 };
const char* thread_level_name(ThreadLevel l);  // "MPI_THREAD_SERIALIZED"

// The level meshtrain asks MPI for: SERIALIZED. Collectives run on the main
// thread and also on autograd's backward thread (on CUDA the engine runs a
// device's backward on its own thread: the tp copy's all-reduce, dp gradient
// buckets, FSDP's hooks, the all-to-all backward; the thread-faithful tests do
// the same on CPU), so FUNNELED (main thread only) is not enough. They never
// overlap: the main thread waits inside backward() while that thread runs,
// and the data loader threads never call MPI, so MULTIPLE (concurrent calls,
// with the locking cost it brings to every call) is not needed.
constexpr ThreadLevel kNeededThreadLevel = ThreadLevel::Serialized;

// Throws, naming both levels and what to do, when MPI provides less than
// `needed` (pure: Runtime passes what MPI_Init_thread/MPI_Query_thread said).
void require_thread_level(ThreadLevel needed, ThreadLevel provided);

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
  // What MPI provides (at least kNeededThreadLevel, or the constructor threw).
  ThreadLevel thread_level() const { return thread_level_; }

  // Aborts every rank of the world (after an error on one of them).
  [[noreturn]] void abort(int code) const;

  // A CPU (MPI) communicator over the whole world.
  std::unique_ptr<Communicator> world() const;

 private:
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool owns_mpi_ = false;
  ThreadLevel thread_level_ = ThreadLevel::Single;  // finalize only an MPI that this Runtime initialised
};

}  // namespace meshtrain
