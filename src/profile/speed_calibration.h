#pragma once
// A short, fixed workload timed on every rank at once: the speed the ranks have right now (their
// load, thread count, binding and clocks together). The ProfileDB records it with its measurements;
// a later run that finds the cache times it again and, when the two differ, rescales or re-measures
// the cache (app/plan_agreement.cpp, docs/planning.md "Profiling").
#include "comm/communicator.h"
#include "core/backend.h"

namespace partrain::profile {

/// Median seconds of 32 back-to-back 256 x 256 x 256 fp32 MatMuls on `backend` (5 timed runs after
/// an untimed one; about 0.1 s on one CPU core), run by every rank of `world` at the same moment (the
/// ranks share the node's cores, as in training); returns the mean over the ranks, the same on every
/// rank. Collective over `world`.
double speed_calibration_seconds(Backend& backend, comm::Communicator& world);

/// The relative difference between a cache's calibration and the current one above which the cache
/// is not used as measured: 15 %.
inline constexpr double kCalibrationTolerance = 0.15;

}  // namespace partrain::profile
