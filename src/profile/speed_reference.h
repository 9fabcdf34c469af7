#pragma once
// A cached profile's speed against the run's own: a few of the cache's layers timed again, on every
// rank at once, and compared with their cached times (docs/planning.md §Profiling). The model's own
// layers, not a stand-in workload: on a VM whose two vCPUs sometimes share one core's AVX-512 units,
// a GEMM loop ran 1.4-1.8x slower while the training steps ran 1.3x slower, and a cache rescaled by
// the GEMM loop's ratio mispredicted by the difference.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "graph/graph.h"
#include "profile/profile_db.h"
#include "profile/profile_request.h"
#include "profile/profiler.h"

namespace partrain::profile {

/// A cached measurement that a run times again: a task set, its microbatch size and its cached
/// forward + backward seconds.
struct SpeedReference {
  std::vector<int> tasks;
  std::int64_t batch = 1;
  double cached_seconds = 0;
};

/// Up to 3 of `requests` that `database` holds, the longest whose cached forward + backward seconds
/// together stay within `budget_seconds` (the shortest alone when none fits). Empty when `database`
/// holds none of them.
std::vector<SpeedReference> choose_speed_references(const ProfileDB& database, std::span<const ProfileRequest> requests,
                                                    double budget_seconds = 0.1);

/// One line per reference ("tasks key;batch;seconds"), for broadcasting; speed_references_from_text
/// reads it back (throws partrain::Error on a malformed line).
std::string speed_references_to_text(std::span<const SpeedReference> references);
std::vector<SpeedReference> speed_references_from_text(const std::string& text);

/// Measured over cached seconds of `references` (of `graph`), every rank timing all of them at the
/// same moment with `options` (as the cache was profiled), over and over for at least 0.2 s: the
/// mean over the ranks of each rank's sum of measured seconds over the sum of cached ones. Timed up to 2 more times while it differs
/// from 1 by more than kCalibrationTolerance (profile/speed_calibration.h), the try closest to 1
/// counting: a passing slowdown shows in one try, load that lasts in all. 1 when `references` is
/// empty. The same value on every rank. Collective over `world` (same references on every rank).
double measured_speed_ratio(const Graph& graph, std::span<const SpeedReference> references, Backend& backend,
                            comm::Communicator& world, const ProfilerOptions& options);

}  // namespace partrain::profile
