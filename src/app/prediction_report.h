#pragma once
// How far a run's plan predicted what happened (docs/planning.md
// §Predictions): the measured step time against the plan's simulated one, and each stage's
// measured peak memory against the plan's memory model.
#include <string>
#include <vector>

#include "plan/plan.h"

namespace partrain::app {

/// The median of `step_seconds` (seconds per optimizer step) without the first step when there are
/// more (it warms caches and allocators up); 0 for none.
double typical_step_seconds(std::vector<double> step_seconds);

/// Per stage of `plan`, the largest of `rank_peak_bytes` (one entry per rank: its allocator's
/// high-water mark, bytes) over the stage's ranks in every pipeline replica. Throws partrain::Error when
/// there is not one entry per rank of the plan.
std::vector<double> stage_peak_bytes(const Plan& plan, const std::vector<double>& rank_peak_bytes);

/// One line: "prediction error: step time +12.0% (measured 0.570 s, median of 15 steps; predicted
/// 0.509 s); peak memory per stage: 0 -3.1% (48.2 of 49.8 MiB predicted), 1 ...". Errors are
/// (measured − predicted) / predicted; a quantity the plan did not predict says "not predicted". A
/// plan of the analytic cost model (no profile) says instead that its step time is for the model's
/// nominal device ("prediction: step time 0.0011 s for the analytic cost model's nominal device, not
/// this machine (measured ...)"); the memory errors stay.
std::string prediction_error_line(const Plan& plan, const std::vector<double>& step_seconds,
                                  const std::vector<double>& stage_peak_bytes);

}  // namespace partrain::app
