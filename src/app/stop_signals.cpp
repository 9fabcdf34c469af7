#include "app/stop_signals.h"

#include <csignal>

namespace partrain::app {
namespace {

volatile std::sig_atomic_t received = 0;

extern "C" void record_stop_signal(int signal_number) {
  if (received == 0) received = signal_number;
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int received_stop_signal() { return received; }

const char* stop_signal_name(int signal_number) {
  switch (signal_number) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace partrain::app
