#pragma once
// From an experiment file to planner inputs: the devices (DeviceSpec) and the PlannerOptions, shared
// by `partrain plan` and `partrain train` so both plan the same way.
#include <string>

#include "io/config.h"
#include "partition/cost_model.h"
#include "partition/planner.h"

namespace partrain::app {

struct PlanningSetup {
  partition::DeviceSpec device;
  partition::PlannerOptions options;
};

/// The setup for `world_size` devices from [train] and [parallel]; `device_memory_bytes` > 0 and a
/// non-empty `planner` override the config. Throws partrain::Error on inconsistent values.
PlanningSetup planning_setup(const ExperimentConfig& config, int world_size, double device_memory_bytes = 0,
                             const std::string& planner = "");

}  // namespace partrain::app
