#include "meshtrain/core/stop_signal.h"

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace meshtrain {

namespace {
// sig_atomic_t: the only type a handler may write (C++ [support.signal]).
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal " + std::to_string(sig);
  }
}
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // No SA_RESTART needed: the work polls the flag.
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

void ignore_file_size_signal() { std::signal(SIGXFSZ, SIG_IGN); }

int stop_requested() { return g_stop_signal; }

Stopped::Stopped(int signal_number, const std::string& during)
    : Error("stopped by " + signal_name(signal_number) + " during " + during + "; nothing of it was written"),
      signal_(signal_number) {}

void throw_if_stop_requested(const std::string& during) {
  if (const int sig = stop_requested()) throw Stopped(sig, during);
}

}  // namespace meshtrain
