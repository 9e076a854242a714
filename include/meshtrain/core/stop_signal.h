#pragma once
// Preemption and Ctrl-C: SIGTERM (SLURM before the time limit), SIGINT and
// SIGUSR1 (what mpirun forwards to its ranks) ask the run to stop. A signal
// handler can only set a flag, so this is the one process-wide state in
// meshtrain: installed by main, polled wherever work may take long.
//   training loop: finishes the step, saves a checkpoint, exits 0;
//   everything else (evaluation, sampling, generate, eval, prepare-data):
//   throw_if_stop_requested() throws Stopped at the next poll, the work in
//   progress is dropped (nothing half-written), and main exits 128 + signal.
#include <string>

#include "meshtrain/core/check.h"

namespace meshtrain {

void install_stop_signal_handlers();
// SIGXFSZ, which a write past the file-size limit (`ulimit -f`, set by batch
// systems) raises, ends the process by default with no message. Ignored, the
// write fails with EFBIG and the error names the file and the limit
// (core/fs.h write_failure), as a full disk does. Called first thing by main,
// before MPI_Init (which writes session files too).
void ignore_file_size_signal();
// The signal number that asked to stop, or 0.
int stop_requested();

class Stopped : public Error {
 public:
  Stopped(int signal_number, const std::string& during);
  int signal_number() const { return signal_; }

 private:
  int signal_;
};

// Throws Stopped (naming `during`) when a stop signal arrived.
void throw_if_stop_requested(const std::string& during);

}  // namespace meshtrain
