#pragma once
// A short, fixed workload timed on every rank at once: the speed the ranks have right now (their
// load, thread count, binding and clocks together), which the ProfileDB records with its
// measurements; and the rescaling of a cache for a run at another speed, which the cache's own
// layers timed again measure (profile/speed_reference.h; app/plan_agreement.cpp, docs/planning.md
// "Profiling").
#include "comm/communicator.h"
#include "core/backend.h"
#include "profile/profile_db.h"

namespace partrain::profile {

/// Median seconds of 32 back-to-back 256 x 256 x 256 fp32 MatMuls on `backend` (5 timed runs after
/// an untimed one; about 0.1 s on one CPU core), run by every rank of `world` at the same moment (the
/// ranks share the node's cores, as in training); returns the mean over the ranks, the same on every
/// rank. Collective over `world`.
double speed_calibration_seconds(Backend& backend, comm::Communicator& world);

/// The relative difference between a cache's speed and the run's above which the cache is not used
/// as measured: 15 %.
inline constexpr double kCalibrationTolerance = 0.15;

/// Scales every time of `database` (a cache) by `speed_ratio` (the run's time over the cache's for
/// the same work: measured_speed_ratio, profile/speed_reference.h) when it differs from 1 by more
/// than kCalibrationTolerance, so that the run plans at its own speed. Returns the factor applied:
/// 1 when none.
double adapt_to_speed(ProfileDB& database, double speed_ratio);

/// `database` as the cache should keep it after a run that adapted it by `speed_factor`
/// (adapt_to_speed's result): every time, those measured in the run included, scaled back by
/// 1 / speed_factor, and the cache's own calibration. Saved as the run saw it, a cache's times
/// would drift by the product of every run's calibration noise.
ProfileDB at_recorded_speed(const ProfileDB& database, double speed_factor);

}  // namespace partrain::profile
