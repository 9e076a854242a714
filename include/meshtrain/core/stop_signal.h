#pragma once
// Preemption: SIGTERM (SLURM before the time limit), SIGINT (Ctrl-C) and
// SIGUSR1 (what mpirun forwards to its ranks) ask the run to stop after the
// current step, save a checkpoint and exit 0. A signal handler can only set a
// flag, so this is the one process-wide state in meshtrain: installed by main,
// read by the trainer between steps.
namespace meshtrain {

void install_stop_signal_handlers();
// The signal number that asked to stop, or 0.
int stop_requested();
// For tests: pretend a signal arrived (or clear it with 0).
void request_stop(int signal_number);

}  // namespace meshtrain
