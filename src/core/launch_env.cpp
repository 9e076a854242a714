#include "meshtrain/core/launch_env.h"

#include <cstdlib>

namespace meshtrain {

namespace {

// The first of the variables that holds a whole non-negative number, or -1.
int first_int(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end == '\0' && x >= 0 && x < (1L << 30)) return static_cast<int>(x);
  }
  return -1;
}

std::string first_text(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) return v;
  return {};
}

}  // namespace

LaunchEnv launch_from_environment() {
  LaunchEnv e;
  const int rank = first_int({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"});
  const int size = first_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"});
  if (rank >= 0 && size > rank) e.rank = rank, e.size = size;
  e.job = first_text({"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"});
  if (e.job.empty()) {
    const std::string job = first_text({"SLURM_JOB_ID"});
    if (!job.empty()) e.job = job + "." + first_text({"SLURM_STEP_ID"});
  }
  return e;
}

}  // namespace meshtrain
