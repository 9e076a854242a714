#pragma once
// What the launcher (mpirun, srun) tells a process through its environment
// before MPI is initialised: its rank, the world size and the job's id. main
// needs them to arm the watchdog and tag log lines before MPI_Init, which
// itself waits for every rank: a rank that never joins is then still caught.
#include <string>

namespace meshtrain {

struct LaunchEnv {
  int rank = 0;     // 0 and 1 without a launcher (a single process)
  int size = 1;
  std::string job;  // the same on every rank of one launch; empty when unknown
};

// OpenMPI (OMPI_COMM_WORLD_RANK/SIZE), PMIx (PMIX_RANK), MPICH's PMI
// (PMI_RANK/SIZE) and SLURM (SLURM_PROCID/NTASKS); the job from
// PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid or SLURM_JOB_ID.SLURM_STEP_ID.
LaunchEnv launch_from_environment();

}  // namespace meshtrain
