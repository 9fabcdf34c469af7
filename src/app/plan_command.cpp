// partrain plan. Config mode plans a model from its experiment file for any world size and device
// memory without training (on the analytic cost model or a saved ProfileDB) and prints the plan
// table; workload mode (--workload FILE.json) splits an external dnn-partitioning graph with the
// ideal DP, DPL or the integer programs of Tarnawski et al. (NeurIPS 2020).
#include <algorithm>
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
#include "partition/common/calibrated_cost_model.h"
#include "partition/planner.h"
#include "partition/tarnawski/dpl.h"
#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/integer_program.h"
#include "partition/tarnawski/workload.h"

namespace partrain::app {
namespace {

// "3-7, 9, 12-13": the file ids of `nodes`, sorted, consecutive runs joined.
std::string id_ranges(const partition::Workload& workload, const std::vector<std::size_t>& nodes) {
  std::vector<long> ids;
  for (std::size_t node : nodes) ids.push_back(workload.nodes[node].id);
  std::sort(ids.begin(), ids.end());
  std::string text;
  for (std::size_t first = 0; first < ids.size();) {
    std::size_t last = first;
    while (last + 1 < ids.size() && ids[last + 1] == ids[last] + 1) ++last;
    if (!text.empty()) text += ", ";
    text += std::to_string(ids[first]);
    if (last > first) {
      text += '-';
      text += std::to_string(ids[last]);
    }
    first = last + 1;
  }
  return text;
}

// --planner ip on a workload: one of Tarnawski et al.'s integer programs through CBC.
int run_workload_ip(const PlanArguments& arguments, const partition::Workload& workload) {
  PARTRAIN_CHECK(arguments.max_ideals >= 0, "--max-ideals must be positive");
  partition::IntegerProgramOptions options;
  options.objective = arguments.objective.empty() ? partition::IpObjective::throughput
                                                  : partition::parse_ip_objective(arguments.objective, "--objective");
  options.contiguous = arguments.contiguous;
  PARTRAIN_CHECK(arguments.contiguity.empty() || arguments.contiguous, "--contiguity needs --contiguous");
  if (arguments.contiguity == "reachability") options.contiguity = partition::IpContiguity::reachability;
  options.subgraphs_per_device = static_cast<int>(arguments.subgraphs_per_device);
  options.accelerators = static_cast<int>(arguments.accelerators);
  options.cpus = static_cast<int>(arguments.cpus);
  if (!arguments.device_memory.empty())
    options.accelerator_memory_bytes = static_cast<double>(parse_memory_size(arguments.device_memory));
  if (arguments.time_limit > 0) options.time_limit_seconds = arguments.time_limit;
  if (arguments.gap >= 0) options.relative_gap = arguments.gap;
  if (arguments.threads > 0) options.threads = static_cast<int>(arguments.threads);
  if (arguments.max_ideals > 0) options.max_ideals = static_cast<std::size_t>(arguments.max_ideals);
  options.warm_start = !arguments.cold;
  options.log = arguments.solver_log;
  options.write_lp = arguments.write_lp;
  const bool latency = options.objective == partition::IpObjective::latency;
  PARTRAIN_CHECK(!latency || options.subgraphs_per_device == 1 || !arguments.contiguous,
                 "--contiguous with --objective latency means one subgraph per device: drop --subgraphs-per-device");
  PARTRAIN_CHECK(latency || options.subgraphs_per_device == 1,
                 "--subgraphs-per-device is for --objective latency (§4); throughput places whole devices");

  const auto start = std::chrono::steady_clock::now();
  const partition::IntegerProgramResult result = partition::solve_integer_program(workload, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const char* program = latency ? (options.subgraphs_per_device == 1 ? "latency, contiguous (Tarnawski et al. §4)"
                                                                     : "latency, q contiguous subgraphs per device (Tarnawski et al. §4)")
                        : options.contiguous ? (options.contiguity == partition::IpContiguity::pipeline
                                                    ? "throughput, contiguous, pipeline-ordered devices (Tarnawski et al. §5.1.3)"
                                                    : "throughput, contiguous, constraints (16) per device (Tarnawski et al. §5.1.3)")
                                             : "throughput, non-contiguous (Tarnawski et al. §5.2)";
  std::printf("workload: %s (%zu nodes, %zu classes)\n", workload.source.c_str(), workload.nodes.size(),
              result.class_count);
  std::printf("planner: ip, %s; solver %s\n", program, partition::mip_solver_version().c_str());
  std::printf("accelerators: %d, cpus: %d, accelerator memory: %.0f bytes", result.placement.accelerators,
              result.placement.cpus,
              options.accelerator_memory_bytes >= 0 ? options.accelerator_memory_bytes : workload.accelerator_memory_bytes);
  if (latency) std::printf(", subgraphs per device: %d", options.subgraphs_per_device);
  std::printf("\n");
  std::printf("program: %d variables (%d integer), %d constraints; time limit %.0f s, gap %g, %d thread%s\n",
              result.variables, result.integer_variables, result.constraints, options.time_limit_seconds,
              options.relative_gap, options.threads, options.threads == 1 ? "" : "s");
  if (result.start_source.empty()) {
    std::printf("warm start: none\n");
  } else {
    std::printf("warm start: %s, %s %.4f ms\n", result.start_source.c_str(), latency ? "latency" : "max load", result.start_ms);
  }
  std::printf("%-14s %4s %10s %10s %10s %10s %10s %14s %6s  %s\n", "device", "slot", "start_ms", "finish_ms", "load_ms",
              "compute", "comm", "size_bytes", "nodes", "node ids");
  for (const partition::SubgraphCost& subgraph : result.subgraphs) {
    const partition::DeviceBlock& device = subgraph.block;
    std::printf("%-11s %2d ", device.accelerator ? "accelerator" : "cpu", device.device_index);
    if (latency) {
      std::printf("%4d %10.4f %10.4f ", subgraph.slot, subgraph.start_ms, subgraph.finish_ms);
    } else {
      std::printf("%4s %10s %10s ", "-", "-", "-");
    }
    std::printf("%10.4f %10.4f %10.4f %14.0f %6zu  %s\n", device.load_ms, device.compute_ms, device.communication_ms,
                device.size_bytes, device.nodes.size(), id_ranges(workload, device.nodes).c_str());
  }
  if (!latency && !options.contiguous)
    std::printf("split: %s\n", !result.placement_contiguous ? "non-contiguous (some device holds a non-contiguous set)"
                               : result.pipeline_ordered   ? "contiguous, pipeline-ordered"
                                                           : "contiguous sets, but their device order has a cycle");
  if (!options.write_lp.empty()) std::printf("integer program written (LP format): %s\n", options.write_lp.c_str());
  std::printf("status: %s\n", partition::to_string(result.status));
  std::printf("%s: %.4f\n", latency ? "latency_ms" : "max_load_ms", result.objective_ms);
  std::printf("bound_ms: %.4f\n", result.bound_ms);
  std::printf("gap: %.6f (%.4f%%)\n", result.gap, 100.0 * result.gap);
  std::printf("solver_seconds: %.3f (cpu %.3f), nodes: %ld\n", result.solver_seconds, result.solver_cpu_seconds,
              result.nodes);
  std::printf("planning_seconds: %.6f\n", seconds);
  return 0;
}

int run_workload_plan(const PlanArguments& arguments) {
  const std::string planner = arguments.planner.empty() ? "ideals" : arguments.planner;
  PARTRAIN_CHECK(planner == "ideals" || planner == "dpl" || planner == "ip",
                 "workload mode supports --planner ideals, dpl or ip, not '" << planner << "'");
  const partition::Workload workload = partition::read_workload(arguments.workload);
  if (planner == "ip") return run_workload_ip(arguments, workload);
  PARTRAIN_CHECK(!arguments.contiguous && arguments.contiguity.empty() && arguments.objective.empty() && arguments.time_limit < 0 && arguments.gap < 0 &&
                     !arguments.cold,
                 "--contiguous, --objective, --time-limit, --gap and --cold belong to --planner ip; the "
                     << planner << " planner always finds a contiguous max-load split");
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

  std::printf("workload: %s (%zu nodes, %zu classes, %zu ideals searched)\n", workload.source.c_str(),
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
  const bool ip_flags = arguments.contiguous || !arguments.contiguity.empty() || !arguments.objective.empty() ||
                        arguments.time_limit > 0 || arguments.gap >= 0;
  PARTRAIN_CHECK(!ip_flags || setup.options.planner == "ip",
                 "--contiguous, --contiguity, --objective, --time-limit and --gap belong to the ip planner (--planner ip), not "
                     << setup.options.planner);
  PARTRAIN_CHECK(arguments.objective.empty() || arguments.objective == "throughput",
                 "--objective latency is the single-stream inference program (Tarnawski §4): plan a workload file with "
                 "--workload FILE.json; a training plan maximises throughput");
  PARTRAIN_CHECK(arguments.contiguity.empty() || arguments.contiguity == "pipeline",
                 "--contiguity reachability may give device sets that form no pipeline; a training plan uses the "
                 "pipeline-ordered program (--contiguity pipeline)");
  PARTRAIN_CHECK(arguments.threads == 0 && arguments.subgraphs_per_device == 1 && !arguments.cold && !arguments.solver_log &&
                     arguments.write_lp.empty(),
                 "--threads, --subgraphs-per-device, --cold, --solver-log and --write-lp are for --workload plans");
  if (arguments.contiguous) setup.options.ip_contiguous = true;
  if (arguments.time_limit > 0) setup.options.ip_time_limit_seconds = arguments.time_limit;
  if (arguments.gap >= 0) setup.options.ip_relative_gap = arguments.gap;

  PlannedGraphs graphs(config);  // the model and each tensor-parallel degree, built once
  const Graph& model = graphs.model();
  std::unique_ptr<profile::ProfileDB> database;
  if (!arguments.profile_db.empty())
    database = std::make_unique<profile::ProfileDB>(profile::ProfileDB::load(arguments.profile_db));
  // The cost model of each graph the planner tries (the model, or a tensor_parallel_graph of it): a
  // saved ProfileDB holds one graph's measurements, so with one only that graph can be planned.
  const partition::CostModelFactory costs = [&](const Graph& graph) -> std::unique_ptr<partition::CostModel> {
    return planning_cost_model(setup, graph, database.get());
  };
  std::printf("model: %s (%zu tasks, %lld parameters), global batch %lld, %ld devices of %.2f GiB\n",
              config.path.c_str(), model.tasks().size(), static_cast<long long>(model.parameter_count()),
              static_cast<long long>(config.train.global_batch), world_size, setup.device.memory_bytes / (1ull << 30));
  std::fflush(stdout);

  io::ProgressBar progress("planning (" + setup.options.planner + ")");
  setup.options.progress = [&progress](double fraction) { progress.update(fraction); };
  const auto start = std::chrono::steady_clock::now();
  const partition::ThreeDimensionalPlan result = plan_experiment(config, graphs, setup, costs);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finish();
  const Plan& plan = result.plan;

  if (!setup.layout_note.empty()) std::printf("%s\n", setup.layout_note.c_str());
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
