#pragma once
// A short, fixed workload timed on every rank at once: the speed the ranks have right now (their
// load, thread count, binding and clocks together). The ProfileDB records it with its measurements;
// a later run that finds the cache times it again and, when the two differ, rescales or re-measures
// the cache (app/plan_agreement.cpp, docs/planning.md "Profiling").
#include "comm/communicator.h"
#include "core/backend.h"
#include "profile/profile_db.h"

namespace partrain::profile {

/// Median seconds of 32 back-to-back 256 x 256 x 256 fp32 MatMuls on `backend` (5 timed runs after
/// an untimed one; about 0.1 s on one CPU core), run by every rank of `world` at the same moment (the
/// ranks share the node's cores, as in training); returns the mean over the ranks, the same on every
/// rank. Collective over `world`.
double speed_calibration_seconds(Backend& backend, comm::Communicator& world);

/// The relative difference between a cache's calibration and the current one above which the cache
/// is not used as measured: 15 %.
inline constexpr double kCalibrationTolerance = 0.15;

/// speed_calibration_seconds, measured up to 3 more times while it differs from `recorded_seconds`
/// (a cache's calibration; 0: none, measured once) by more than kCalibrationTolerance; returns the
/// measurement closest to the recorded one. A calibration is 0.1 s: on a VM whose vCPUs slow down
/// for a moment (here: 10.4-10.9 ms or 13.8-20 ms per process, while training steps stayed within
/// 3%) one measurement would rescale a cache for a passing blip; load that lasts (a build beside the
/// run) shows in every try. Collective over `world` (every rank gets the same `recorded_seconds`).
double speed_calibration_against(Backend& backend, comm::Communicator& world, double recorded_seconds);

/// Scales every time of `database` (a cache) by current / recorded calibration when a run's
/// `calibration_seconds` differs from the cache's by more than kCalibrationTolerance, so that the
/// run plans at its own speed. Returns the factor applied: 1 when none (also when either calibration
/// is 0, an older cache or no measurement).
double adapt_to_speed(ProfileDB& database, double calibration_seconds);

/// `database` as the cache should keep it after a run that adapted it by `speed_factor`
/// (adapt_to_speed's result): every time, those measured in the run included, scaled back by
/// 1 / speed_factor, and the cache's own calibration. Saved as the run saw it, a cache's times
/// would drift by the product of every run's calibration noise.
ProfileDB at_recorded_speed(const ProfileDB& database, double speed_factor);

}  // namespace partrain::profile
