#pragma once
// How busy a node's cores are with processes other than the job's ranks: the load a profile was
// measured under, which the ProfileDB records and a later run compares with its own
// (docs/planning.md §Profiling). From Linux's /proc/stat (the node's busy CPU time) less the ranks'
// own CPU time (getrusage), over a window in which the ranks compute.
#include <chrono>
#include <optional>

#include "comm/communicator.h"

namespace partrain::profile {

/// The shortest window that tells the load: /proc/stat counts in clock ticks of 10 ms, so a window
/// of 0.1 s reads each core's use to about a tenth.
inline constexpr double kShortestLoadWindowSeconds = 0.1;

/// Measures, over the window from construction to share_of_other_load(), this rank's
/// share of the node's CPU time spent by other processes: (node busy seconds / ranks_per_node − this
/// process's CPU seconds) / window seconds. Summed over a node's ranks, it is the number of cores
/// other processes kept busy; app code sums over the world and divides by the node count.
class OtherLoadMeter {
 public:
  OtherLoadMeter();
  /// This rank's share (cores; may be slightly negative from clock-tick rounding) over the window,
  /// for `ranks_per_node` ≥ 1 ranks of the job on this node; empty when /proc/stat cannot be read
  /// (not Linux) or the window is shorter than kShortestLoadWindowSeconds.
  std::optional<double> share_of_other_load(int ranks_per_node) const;

 private:
  double node_busy_seconds_ = -1;
  double process_seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
};

/// Cores that processes other than the job's ranks kept busy per node over `meter`'s window (each
/// rank's meter; the mean over the nodes, at least 0), `ranks_per_node` ranks on each node; −1 when
/// a rank cannot tell. The same on every rank. Collective over `world`.
double other_load_cores(const OtherLoadMeter& meter, comm::Communicator& world, int ranks_per_node);

/// Busy CPU seconds of the whole node since boot (user, nice, system, irq, softirq of /proc/stat's
/// "cpu" line; idle, iowait and a VM's steal excluded); −1 when unreadable.
double node_busy_cpu_seconds();

/// CPU seconds (user + system, every thread) this process has used.
double process_cpu_seconds();

/// True when two other-load figures (cores; < 0: not recorded) describe different conditions: both
/// known and apart by at least kOtherLoadTolerance cores. A profile measured under other conditions
/// is rescaled for the run; under the same ones, a speed difference is run-to-run noise.
bool other_load_differs(double cached_cores, double current_cores);

/// Cores of other load that make a difference: half a core.
inline constexpr double kOtherLoadTolerance = 0.5;

}  // namespace partrain::profile
