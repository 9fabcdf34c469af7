#pragma once
// The optimizer step's cost on this rank's device (part of profiling before planning): one
// optimizer step is a few passes over every parameter, so its time grows with parameter bytes;
// the planner's simulated step time adds it per stage.
#include <string>

#include "core/backend.h"
#include "runtime/optimizer.h"

namespace partrain::app {

/// Median seconds per fp32 parameter byte of one `optimizer` step ("adamw" or "sgd") with
/// `settings` on `backend` as the executor's step runs it (the gradients zeroed where the step
/// begins; the gradients' sum of squares for the global norm, then the update), each part from cold
/// caches (Backend::flush_caches), and with a 16-bit `working` dtype the working copy of the
/// parameters made again after the update (mixed precision); timed on a 4 Mi-element parameter
/// after one warm-up step (`repeats` timed steps), by the wall clock or, with `cpu_time`, the process's CPU time
/// (profile::pass_clock_seconds, for ranks sharing cores). Throws partrain::Error for an unknown
/// optimizer.
double measure_optimizer_seconds_per_byte(Backend& backend, const std::string& optimizer,
                                          const runtime::OptimizerSettings& settings, int repeats = 5,
                                          bool cpu_time = false, DType working = DType::F32);

}  // namespace partrain::app
