#include "meshtrain/core/stop_signal.h"

#include <csignal>
#include <initializer_list>

namespace meshtrain {

namespace {
// sig_atomic_t: the only type a handler may write (C++ [support.signal]).
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // No SA_RESTART needed: the trainer polls the flag between steps.
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

int stop_requested() { return g_stop_signal; }

void request_stop(int signal_number) { g_stop_signal = signal_number; }

}  // namespace meshtrain
