#pragma once
// Per-op-type timing of the interpreter's kernel calls ([log] op_profile = true): where a step's
// time goes, by op type, forward and backward apart. Off by default; when no profile is active the
// interpreter pays one pointer test per task.
#include <map>
#include <string>
#include <utility>

#include "core/op_type.h"

namespace partrain {

class Backend;

/// Seconds and calls summed per (op type, direction).
class OpProfile {
 public:
  enum class Direction { Forward, Backward };
  struct Entry {
    double seconds = 0.0;
    long long calls = 0;
  };

  /// Adds one kernel call of `seconds` (wall time, after the backend synchronised) to (op, direction).
  void record(OpType op, Direction direction, double seconds);
  /// Every (op name, direction) with its sums; names as op_name(), directions "forward"/"backward".
  std::map<std::pair<std::string, std::string>, Entry> entries() const;
  /// The sum of every entry's seconds.
  double total_seconds() const;
  /// A text table, one row per (op, direction), slowest first, with each row's share of
  /// `step_seconds` (the summed step time the profile covers; <= 0: no share column).
  std::string format(double step_seconds) const;
  /// A compact serialisation (for gathering to rank 0) and its inverse.
  std::string serialise() const;
  static OpProfile deserialise(const std::string& text);

 private:
  std::map<std::pair<std::string, std::string>, Entry> entries_;
};

/// The profile the interpreter records into on this thread, or nullptr (the default: no timing).
OpProfile* active_op_profile();

/// Makes `profile` the active one while alive and restores the previous one after (RAII).
class ScopedOpProfile {
 public:
  explicit ScopedOpProfile(OpProfile* profile);
  ~ScopedOpProfile();
  ScopedOpProfile(const ScopedOpProfile&) = delete;
  ScopedOpProfile& operator=(const ScopedOpProfile&) = delete;

 private:
  OpProfile* previous_;
};

}  // namespace partrain
