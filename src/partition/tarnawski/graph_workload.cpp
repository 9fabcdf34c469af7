#include "partition/tarnawski/graph_workload.h"

#include <algorithm>
#include <limits>
#include <map>

#include "core/error.h"
#include "partition/tarnawski/dpl.h"
#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/integer_program.h"
#include "partition/common/plan_builder.h"

namespace partrain::partition {

Workload workload_from_groups(const Graph& graph, const std::vector<std::vector<int>>& groups, const CostModel& cost,
                              std::int64_t batch, int accelerators, const PlannerOptions& options) {
  Workload workload;
  workload.source = "model graph";
  workload.accelerators = accelerators;
  workload.cpus = 0;
  workload.accelerator_memory_bytes = options.usable_memory_bytes(cost.device());
  const double state_factor = profile::model_state_factor(stage_memory_policy(options, 0, 1, 1));
  std::vector<int> group_of(graph.tasks().size(), -1);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const profile::Measurement m = cost.measure(groups[g], batch);
    WorkloadNode node;
    node.id = static_cast<long>(g);
    node.name = graph.task(groups[g].front()).name;
    node.accelerator_latency_ms = (m.forward_seconds + m.backward_seconds) * 1e3;
    node.cpu_latency_ms = node.accelerator_latency_ms;
    node.size_bytes = m.parameter_bytes * state_factor + m.activation_bytes;
    workload.nodes.push_back(node);
    for (int task : groups[g]) group_of[task] = static_cast<int>(g);
  }
  // One edge per (producer group, consumer group) pair; its cost is the heaviest activation between them.
  std::map<std::pair<int, int>, double> edge_bytes;
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Activation || value.producer < 0 || group_of[value.producer] < 0) continue;
    const double bytes = static_cast<double>(value.type.bytes(batch));
    for (int consumer : value.consumers) {
      if (group_of[consumer] < 0 || group_of[consumer] == group_of[value.producer]) continue;
      double& entry = edge_bytes[{group_of[value.producer], group_of[consumer]}];
      entry = std::max(entry, bytes);
    }
  }
  const bool across_nodes = accelerators > cost.device().devices_per_node;
  for (const auto& [edge, bytes] : edge_bytes)
    workload.edges.push_back({static_cast<std::size_t>(edge.first), static_cast<std::size_t>(edge.second),
                              2.0 * cost.transfer_seconds(bytes, across_nodes) * 1e3});
  return workload;
}

namespace {

// The ip planner's split: the pipeline-ordered contiguous program, its device sets in pipeline order.
PartitionResult integer_program_split(const Workload& workload, const PlannerOptions& options) {
  IntegerProgramOptions ip_options;
  ip_options.contiguous = true;
  ip_options.contiguity = IpContiguity::pipeline;
  ip_options.time_limit_seconds = options.ip_time_limit_seconds;
  ip_options.relative_gap = options.ip_relative_gap;
  ip_options.max_ideals = options.max_ideals;
  const IntegerProgramResult solved = solve_throughput_ip(workload, ip_options);
  PartitionResult result;
  result.max_load_ms = solved.objective_ms;
  result.class_count = solved.class_count;
  for (const SubgraphCost& subgraph : solved.subgraphs) result.devices.push_back(subgraph.block);
  return result;
}

}  // namespace

Plan plan_tarnawski(const Graph& graph, const CostModel& cost, const PlannerOptions& options, TarnawskiSplit split) {
  const char* name = split == TarnawskiSplit::dpl ? "dpl" : split == TarnawskiSplit::ideals ? "ideals" : "ip";
  PARTRAIN_CHECK(split != TarnawskiSplit::integer_program || options.ip_contiguous,
                 "the ip planner was asked for non-contiguous splits ([parallel] ip_contiguous = false, Tarnawski et "
                 "al. §5.2), but training needs contiguous ones: each pipeline stage runs a convex subgraph of the "
                 "model and sends activations forward only, which a non-contiguous device set does not allow. Set "
                 "ip_contiguous = true (§5.1.3), or study non-contiguous splits of a graph with `partrain plan "
                 "--workload FILE.json --planner ip`");
  std::vector<std::vector<int>> groups;
  std::size_t non_constant = 0;
  for (const Task& task : graph.tasks()) non_constant += !task.constant;
  if (non_constant > 4000) {
    for (const LayerGroup& layer : layer_groups(graph)) {
      std::vector<int> tasks;
      for (int task : layer.tasks)
        if (!graph.task(task).constant) tasks.push_back(task);
      groups.push_back(std::move(tasks));
    }
  } else {
    for (const Task& task : graph.tasks())
      if (!task.constant) groups.push_back({task.id});
  }
  const std::int64_t batch = std::max<std::int64_t>(1, options.global_batch / options.world_size);
  Plan best;
  bool found = false;
  std::string last_error;
  for (int devices = options.world_size; devices >= 1; --devices) {
    if (options.world_size % devices != 0) continue;
    const Workload workload = workload_from_groups(graph, groups, cost, batch, devices, options);
    PartitionOptions partition_options;
    partition_options.max_ideals = options.max_ideals;
    PartitionResult result;
    try {
      result = split == TarnawskiSplit::dpl      ? partition_linearised(workload, partition_options)
               : split == TarnawskiSplit::ideals ? partition_ideals(workload, partition_options)
                                                 : integer_program_split(workload, options);
    } catch (const TooManyIdealsError&) {
      throw;  // more devices cannot help: say so
    } catch (const Error& error) {
      last_error = error.what();
      continue;
    }
    std::vector<std::vector<int>> stages;
    for (const DeviceBlock& block : result.devices) {
      std::vector<int> tasks;
      for (std::size_t node : block.nodes) tasks.insert(tasks.end(), groups[node].begin(), groups[node].end());
      if (!tasks.empty()) stages.push_back(std::move(tasks));
    }
    const int stage_count = static_cast<int>(stages.size());
    if (options.world_size % stage_count != 0) continue;
    try {
      Plan plan = plan_from_stages(graph, attach_constant_tasks(graph, std::move(stages)),
                                   equal_replicas(options.world_size, stage_count), cost, options, name);
      if (!found || plan.predicted_step_seconds < best.predicted_step_seconds) best = std::move(plan);
      found = true;
    } catch (const Error& error) {
      last_error = error.what();
    }
  }
  PARTRAIN_CHECK(found, name << ": no plan fits: " << last_error);
  return best;
}

}  // namespace partrain::partition
