#include "core/watchdog.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace partrain {

Watchdog::Watchdog(double seconds, std::string message, int exit_code, std::function<void()> before_exit) {
  thread_ = std::thread([this, seconds, message = std::move(message), exit_code, before_exit = std::move(before_exit)] {
    std::unique_lock lock(mutex_);
    if (done_changed_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) return;
    std::fprintf(stderr, "partrain: error: %s\n", message.c_str());
    std::fflush(stderr);
    if (before_exit) before_exit();
    ::_exit(exit_code);
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  done_changed_.notify_all();
  thread_.join();
}

}  // namespace partrain
