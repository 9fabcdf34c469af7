#include "app/planning.h"

#include "core/error.h"

namespace partrain::app {

PlanningSetup planning_setup(const ExperimentConfig& config, int world_size, double device_memory_bytes,
                             const std::string& planner) {
  PARTRAIN_CHECK(world_size > 0, "the world size must be positive, not " << world_size);
  const ParallelConfig& parallel = config.parallel;
  PlanningSetup setup;
  setup.device.flops_per_second = parallel.device_flops;
  setup.device.memory_bytes = device_memory_bytes > 0 ? device_memory_bytes : parallel.device_memory_bytes;
  setup.device.link_bandwidth = parallel.link_bandwidth;
  setup.device.network_bandwidth = parallel.network_bandwidth;
  setup.device.devices_per_node = static_cast<int>(parallel.devices_per_node);

  partition::PlannerOptions& options = setup.options;
  options.planner = planner.empty() ? parallel.planner : planner;
  options.world_size = world_size;
  options.global_batch = config.train.global_batch;
  options.microbatches = static_cast<int>(config.train.microbatches);
  options.schedule = parse_schedule(parallel.schedule);
  options.recompute = parallel.recompute;
  options.memory_margin = parallel.memory_margin;
  options.optimizer_state_copies = config.train.optimizer == "adamw" ? 2 : 1;
  options.mixed_precision = config.train.precision == "bf16";
  options.blocks = static_cast<int>(parallel.blocks);
  options.max_microbatches = static_cast<int>(parallel.max_microbatches);
  options.max_ideals = static_cast<std::size_t>(parallel.max_ideals);
  options.stages = static_cast<int>(parallel.stages);
  options.replicas = parallel.replicas;
  options.boundaries = parallel.boundaries;
  return setup;
}

}  // namespace partrain::app
