#pragma once
// The one seam where tests inject faults into a real run, so that the
// training loop itself carries no test code. Read once from the environment:
//   MESHTRAIN_TEST_NAN_AT_STEP=K[-L]    the updates logged as steps K (to L) get
//                                       NaN gradients on every rank (nan_policy tests)
//   MESHTRAIN_TEST_NAN_WEIGHTS_AT_STEP=K after the update of step K every parameter
//                                       is NaN (a checkpoint with NaN weights: sampling tests)
//   MESHTRAIN_TEST_STALL_AT_STEP=K      before step K, the ranks named by
//   MESHTRAIN_TEST_STALL_RANKS=r[,r..]  stop making progress (watchdog tests);
//                                       K = init: stop (SIGSTOP) before MPI
//                                       initialisation
//                                       (r: the launcher's rank, launch_env.h)
//   MESHTRAIN_TEST_SIGSTOP_AT_STEP=K    those ranks stop themselves (SIGSTOP) after the
//                                       backward pass of step K, mid-step, 2.5 s after
//                                       their last op (so their heartbeat's flight
//                                       summary is current; flight recorder tests)
//   MESHTRAIN_TEST_SIGSTOP_HOLD=1       ...and once continued (mpirun ends a job with
//                                       SIGCONT, then SIGTERM) they stay parked until
//                                       killed, never reaching their next op: a node that
//                                       does not come back
//   MESHTRAIN_TEST_SLOW_RANK=r:ms       rank r sleeps ms before every step (straggler report)
//   MESHTRAIN_TEST_CKPT_WRITE_DELAY=K:s the background write of checkpoint step K
//                                       (async_checkpoint) sleeps s seconds before
//                                       writing (the save stays in flight meanwhile)
//   MESHTRAIN_TEST_HOST_READ_AT_STEP=K  after the backward pass of step K the host reads a
//                                       gradient (.item()): a step no CUDA graph can replay
//   MESHTRAIN_TEST_ALLOC_AT_STEP=K      after the backward pass of step K a buffer is
//                                       allocated and freed: memory use another step lacks
//                                       (both: device_config.cuda_graphs' safety check)
// Unset variables inject nothing.
#include <cstdint>
#include <vector>

#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

class TestHooks {
 public:
  static TestHooks from_environment();

  // After the backward pass of the step that will be logged as `step`.
  void after_backward(int64_t step, ParallelModel& pm) const;
  // After the update of the step logged as `step`.
  void after_update(int64_t step, ParallelModel& pm) const;
  // Before the step that will be logged as `step`, on world rank `rank`.
  void before_step(int64_t step, int rank) const;
  // In main, after the watchdog is armed and before MPI_Init.
  void before_mpi_init(int rank) const;
  // Seconds the background write of checkpoint `step` sleeps (0: none).
  double checkpoint_write_delay(int64_t step) const { return step == ckpt_delay_step_ ? ckpt_delay_seconds_ : 0; }

 private:
  int64_t nan_from_ = -1, nan_to_ = -1;
  int64_t nan_weights_at_ = -1;
  int64_t stall_at_step_ = -1;
  bool stall_before_init_ = false;
  std::vector<int> stall_ranks_;
  int launch_rank_ = 0;  // this process's launcher rank (launch_env.h)
  int64_t sigstop_at_step_ = -1;
  bool sigstop_hold_ = false;
  int slow_rank_ = -1;
  int64_t slow_ms_ = 0;
  int64_t host_read_at_ = -1, alloc_at_ = -1;
  int64_t ckpt_delay_step_ = -1;
  double ckpt_delay_seconds_ = 0;
};

}  // namespace meshtrain
