// partrain plan. Workload mode (--workload FILE.json) splits an external dnn-partitioning graph with
// the ideal DP or DPL of Tarnawski et al. (NeurIPS 2020); planning a model config is not done yet.
#include <chrono>
#include <cstdio>
#include <string>

#include "app/commands.h"
#include "core/error.h"
#include "core/units.h"
#include "partition/dpl.h"
#include "partition/ideals_dp.h"
#include "partition/workload.h"

namespace partrain::app {
namespace {

int run_workload_plan(const PlanArguments& arguments) {
  const std::string planner = arguments.planner.empty() ? "ideals" : arguments.planner;
  PARTRAIN_CHECK(planner == "ideals" || planner == "dpl",
                 "workload mode supports --planner ideals or dpl, not '" << planner << "'");
  const partition::Workload workload = partition::read_workload(arguments.workload);
  partition::PartitionOptions options;
  PARTRAIN_CHECK(arguments.accelerators >= -1 && arguments.cpus >= -1, "--accelerators and --cpus must be non-negative");
  options.accelerators = static_cast<int>(arguments.accelerators);
  options.cpus = static_cast<int>(arguments.cpus);
  if (!arguments.device_memory.empty())
    options.accelerator_memory_bytes = static_cast<double>(parse_memory_size(arguments.device_memory));
  const auto start = std::chrono::steady_clock::now();
  const partition::PartitionResult result = planner == "ideals" ? partition::partition_ideals(workload, options)
                                                                : partition::partition_linearised(workload, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("workload: %s (%zu nodes, %zu colour classes, %zu ideals searched)\n", workload.source.c_str(),
              workload.nodes.size(), result.class_count, result.ideal_count);
  std::printf("planner: %s, accelerators: %d, cpus: %d, accelerator memory: %.0f bytes\n", planner.c_str(),
              options.accelerators >= 0 ? options.accelerators : workload.accelerators,
              options.cpus >= 0 ? options.cpus : workload.cpus,
              options.accelerator_memory_bytes >= 0 ? options.accelerator_memory_bytes : workload.accelerator_memory_bytes);
  std::printf("%-14s %10s %10s %10s %14s %6s  %s\n", "device", "load_ms", "compute", "comm", "size_bytes", "nodes",
              "first nodes");
  for (const partition::DeviceBlock& device : result.devices) {
    std::string names;
    for (std::size_t position = 0; position < device.nodes.size() && position < 4; ++position) {
      const partition::WorkloadNode& node = workload.nodes[device.nodes[position]];
      if (!names.empty()) names += ", ";
      names += node.name.empty() ? std::to_string(node.id) : node.name;
    }
    if (device.nodes.size() > 4) names += ", ...";
    const std::string label = (device.accelerator ? "accelerator " : "cpu ") + std::to_string(device.device_index);
    std::printf("%-14s %10.4f %10.4f %10.4f %14.0f %6zu  %s\n", label.c_str(), device.load_ms, device.compute_ms,
                device.communication_ms, device.size_bytes, device.nodes.size(), names.c_str());
  }
  std::printf("max_load_ms: %.4f\n", result.max_load_ms);
  std::printf("planning_seconds: %.6f\n", seconds);
  return 0;
}

}  // namespace

int run_plan(const PlanArguments& arguments) {
  if (!arguments.workload.empty()) return run_workload_plan(arguments);
  std::fprintf(stderr, "partrain plan: planning a model config is not implemented yet\n");
  return 2;
}

}  // namespace partrain::app
