#pragma once
// A deadline for a blocking step that might never return (closing a parallel HDF5 file after a
// failed write: a collective inside HDF5 that one rank may have left). If the step is not done
// in time, the process prints a message and ends itself (_exit), so that mpiexec or srun ends the
// job instead of every rank waiting forever.
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace partrain {

/// Starts a thread that, unless the Watchdog is destroyed within `seconds`, writes
/// "partrain: error: <message>" to stderr, runs `before_exit` (when given; e.g. removing a
/// half-written file) and ends the process with _exit(`exit_code`).
class Watchdog {
 public:
  Watchdog(double seconds, std::string message, int exit_code = 1, std::function<void()> before_exit = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace partrain
