#pragma once
// One run per directory: an exclusive lock on `<directory>/.lock` (flock, non-blocking) that rank 0
// of `partrain train` holds for the whole run, before anything is written to its run directory (and
// to its checkpoint directory when that is elsewhere). The file records the holder (host, pid, start
// time) so that a second run into the same directory fails at once naming it. The kernel drops a
// flock when its holder exits, however it exits, so a killed run never blocks the next one: its
// lock file is merely left non-empty, and the next run takes it over (and says so). A run that ends
// normally empties the file before releasing the lock.
#include <string>

namespace partrain::io {

/// Who holds (or held) a run lock, as recorded in the lock file.
struct RunLockHolder {
  std::string host;
  long pid = 0;
  std::string started;  // local time, "YYYY-MM-DD HH:MM:SS"

  /// "host H, pid P, started T".
  std::string describe() const;
};

/// An exclusive lock on one directory, released (and its file emptied) on destruction. Movable.
class RunLock {
 public:
  /// Creates `directory` if needed and locks `<directory>/.lock` for this process. Throws
  /// partrain::Error naming the directory and the holder (host, pid, start time) when another run
  /// holds it, or naming the file when it cannot be created or locked.
  static RunLock acquire(const std::string& directory);

  RunLock() = default;
  ~RunLock();
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  /// The lock file's path ("<directory>/.lock").
  const std::string& path() const { return path_; }
  /// True when the lock file still named a holder that had gone (a killed or crashed run): the
  /// lock was taken over; `previous_holder()` says whose it was.
  bool took_over() const { return took_over_; }
  const RunLockHolder& previous_holder() const { return previous_; }

 private:
  void release();

  std::string path_;
  int descriptor_ = -1;
  bool took_over_ = false;
  RunLockHolder previous_;
};

}  // namespace partrain::io
