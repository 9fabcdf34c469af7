#pragma once
// Stopping a run cleanly on SIGUSR1 or SIGTERM (Slurm's --signal before a time limit, preemption,
// `kill -USR1`): the handler only records the signal; the training loop asks at every step
// boundary, all ranks agree (one all-reduce), write a checkpoint of that step and exit with
// kExitStoppedBySignal.

namespace partrain::app {

/// The exit code of a run that a signal stopped after it wrote a checkpoint: resume it with
/// `--resume latest` (the Slurm job scripts requeue on it).
inline constexpr int kExitStoppedBySignal = 3;

/// Installs the SIGUSR1 and SIGTERM handlers (async-signal-safe: they store the signal number).
void install_stop_signal_handlers();

/// The first stop signal received since installation (SIGUSR1 or SIGTERM), 0 when none.
int received_stop_signal();

/// "SIGUSR1", "SIGTERM", or "signal N".
const char* stop_signal_name(int signal_number);

}  // namespace partrain::app
