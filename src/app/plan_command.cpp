// partrain plan. Config mode plans a model from its experiment file for any world size and device
// memory without training (on the analytic cost model or a saved ProfileDB) and prints the plan
// table; workload mode (--workload FILE.json) splits an external dnn-partitioning graph with the
// ideal DP or DPL of Tarnawski et al. (NeurIPS 2020).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "app/commands.h"
#include "app/planning.h"
#include "core/error.h"
#include "core/units.h"
#include "io/config.h"
#include "io/progress_bar.h"
#include "models/model.h"
#include "partition/calibrated_cost_model.h"
#include "partition/planner.h"
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
  if (arguments.max_ideals > 0) options.max_ideals = static_cast<std::size_t>(arguments.max_ideals);
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

int run_config_plan(const PlanArguments& arguments) {
  const ExperimentConfig config = load_experiment(arguments.config, arguments.overrides);
  const long world_size = arguments.world_size > 0 ? arguments.world_size
                          : config.parallel.world_size > 0 ? config.parallel.world_size : 1;
  const double device_memory =
      arguments.device_memory.empty() ? 0.0 : static_cast<double>(parse_memory_size(arguments.device_memory));
  app::PlanningSetup setup = planning_setup(config, static_cast<int>(world_size), device_memory, arguments.planner);
  if (arguments.max_ideals > 0) setup.options.max_ideals = static_cast<std::size_t>(arguments.max_ideals);

  const Graph model = build_model(config.model);
  std::unique_ptr<profile::ProfileDB> database;
  if (!arguments.profile_db.empty())
    database = std::make_unique<profile::ProfileDB>(profile::ProfileDB::load(arguments.profile_db));
  // The cost model of each graph the planner tries (the model, or a tensor_parallel_graph of it): a
  // saved ProfileDB holds one graph's measurements, so with one only that graph can be planned.
  const partition::CostModelFactory costs = [&](const Graph& graph) -> std::unique_ptr<partition::CostModel> {
    if (!database) return partition::make_analytic_cost_model(graph, setup.device, setup.options.mixed_precision);
    return partition::make_calibrated_cost_model(graph, *database, setup.device);
  };
  std::printf("model: %s (%zu tasks, %lld parameters), global batch %lld, %ld devices of %.2f GiB\n",
              config.path.c_str(), model.tasks().size(), static_cast<long long>(model.parameter_count()),
              static_cast<long long>(config.train.global_batch), world_size, setup.device.memory_bytes / (1ull << 30));
  std::fflush(stdout);

  ProgressBar progress("planning (" + setup.options.planner + ")");
  setup.options.progress = [&progress](double fraction) { progress.update(fraction); };
  const auto start = std::chrono::steady_clock::now();
  const partition::ThreeDimensionalPlan result = plan_experiment(config, model, setup, costs);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finish();
  const Plan& plan = result.plan;

  if (result.candidates.size() > 1) std::fputs(format_layout_candidates(result).c_str(), stdout);
  std::fputs(format_plan_table(plan).c_str(), stdout);
  std::fputs(format_device_throughput(plan, model, result.graph, config.parallel.device_flops).c_str(), stdout);
  if (!arguments.save.empty()) {
    plan.save(arguments.save);
    std::printf("plan saved: %s\n", arguments.save.c_str());
  }
  std::printf("planning_seconds: %.6f\n", seconds);
  return 0;
}

}  // namespace

int run_plan(const PlanArguments& arguments) {
  if (!arguments.workload.empty()) return run_workload_plan(arguments);
  return run_config_plan(arguments);
}

}  // namespace partrain::app
