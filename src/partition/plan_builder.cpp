#include "partition/plan_builder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "core/error.h"
#include "models/model.h"

namespace partrain::partition {

std::vector<LayerGroup> layer_groups(const Graph& graph) {
  const std::vector<Task>& tasks = graph.tasks();
  std::vector<LayerGroup> groups;
  std::map<std::string, std::size_t> group_index;
  std::vector<int> group_of(tasks.size(), -1);
  for (const Task& task : tasks) {
    if (task.constant) continue;
    const std::string layer = layer_of(task.name);
    auto [found, inserted] = group_index.try_emplace(layer, groups.size());
    if (inserted) groups.push_back({layer, {}});
    group_of[task.id] = static_cast<int>(found->second);
    groups[found->second].tasks.push_back(task.id);
  }
  // Order the groups topologically in the group DAG (ties: first task id), since a layer can start
  // before another that feeds it (BERT's MLM head starts before the pooler that feeds its NSP head).
  {
    const std::size_t count = groups.size();
    std::vector<std::vector<int>> successors(count);
    std::vector<int> indegree(count, 0);
    for (const Task& task : tasks) {
      if (group_of[task.id] < 0) continue;
      for (int output : task.outputs)
        for (int consumer : graph.value(output).consumers) {
          const int from = group_of[task.id], to = group_of[consumer];
          if (to < 0 || to == from) continue;
          successors[from].push_back(to);
          ++indegree[to];
        }
    }
    std::vector<int> order;
    std::vector<bool> ready(count, false);
    for (std::size_t g = 0; g < count; ++g) ready[g] = indegree[g] == 0;
    for (std::size_t step = 0; step < count; ++step) {
      int next = -1;  // the ready group with the smallest index (= first task id)
      for (std::size_t g = 0; g < count && next < 0; ++g)
        if (ready[g]) next = static_cast<int>(g);
      PARTRAIN_CHECK(next >= 0, "layer_groups: the layers of the graph form a cycle");
      ready[next] = false;
      indegree[next] = -1;
      order.push_back(next);
      for (int to : successors[next])
        if (--indegree[to] == 0) ready[to] = true;
    }
    std::vector<LayerGroup> sorted;
    std::vector<int> new_index(count);
    for (std::size_t position = 0; position < count; ++position) {
      new_index[order[position]] = static_cast<int>(position);
      sorted.push_back(std::move(groups[order[position]]));
    }
    groups = std::move(sorted);
    for (int& group : group_of)
      if (group >= 0) group = new_index[group];
  }
  // A constant task is cloned into every group that consumes it, directly or through other
  // constant tasks (RaNNC §III-A): consumers come later in id order, so walk backwards.
  std::vector<std::vector<int>> constant_groups(tasks.size());
  for (auto task = tasks.rbegin(); task != tasks.rend(); ++task) {
    if (!task->constant) continue;
    std::vector<int>& into = constant_groups[task->id];
    for (int output : task->outputs) {
      for (int consumer : graph.value(output).consumers) {
        if (group_of[consumer] >= 0) into.push_back(group_of[consumer]);
        into.insert(into.end(), constant_groups[consumer].begin(), constant_groups[consumer].end());
      }
    }
    std::sort(into.begin(), into.end());
    into.erase(std::unique(into.begin(), into.end()), into.end());
    if (into.empty() && !groups.empty()) into.push_back(static_cast<int>(groups.size()) - 1);  // feeds only outputs
    for (int group : into) groups[group].tasks.push_back(task->id);
  }
  for (LayerGroup& group : groups) std::sort(group.tasks.begin(), group.tasks.end());
  return groups;
}

std::vector<int> join_groups(const std::vector<LayerGroup>& groups, std::size_t first, std::size_t last) {
  PARTRAIN_CHECK(first <= last && last <= groups.size(), "join_groups: bad range [" << first << ", " << last << ")");
  std::vector<int> tasks;
  for (std::size_t g = first; g < last; ++g) tasks.insert(tasks.end(), groups[g].tasks.begin(), groups[g].tasks.end());
  std::sort(tasks.begin(), tasks.end());
  tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
  return tasks;
}

RecomputePolicy recompute_policy(const PlannerOptions& options, int stage_count) {
  if (options.recompute == "auto") return stage_count > 1 ? RecomputePolicy::StageBoundaries : RecomputePolicy::None;
  return parse_recompute(options.recompute);
}

profile::MemoryPolicy stage_memory_policy(const PlannerOptions& options, int stage, int stage_count, int microbatches) {
  profile::MemoryPolicy policy;
  policy.optimizer_state_copies = options.optimizer_state_copies;
  policy.mixed_precision = options.mixed_precision;
  policy.recompute = recompute_policy(options, stage_count) != RecomputePolicy::None;
  policy.microbatches_in_flight = options.schedule == ScheduleKind::GPipe
                                      ? microbatches
                                      : std::min(stage_count - stage, microbatches);
  return policy;
}

namespace {
// Whether a group of `devices` consecutive devices spans more than one node.
bool spans_nodes(const CostModel& cost, int devices) { return devices > cost.device().devices_per_node; }
}  // namespace

void predict_plan(Plan& plan, const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const int stage_count = static_cast<int>(plan.stages.size());
  const bool across_nodes = spans_nodes(cost, plan.devices_per_copy());
  double slowest = 0.0, allreduce = 0.0;
  for (int s = 0; s < stage_count; ++s) {
    PlanStage& stage = plan.stages[s];
    auto [begin, end] = plan.replica_samples(s, 0);  // replica 0 holds the largest share
    const profile::Measurement m = cost.measure(stage.tasks, end - begin);
    const profile::MemoryPolicy policy = stage_memory_policy(options, s, stage_count, plan.microbatches);
    stage.recompute = recompute_policy(options, stage_count);
    stage.forward_seconds = m.forward_seconds + cost.transfer_seconds(m.boundary_output_bytes, across_nodes);
    stage.backward_seconds = m.backward_seconds + cost.transfer_seconds(m.boundary_input_bytes, across_nodes) +
                             (policy.recompute ? m.forward_seconds : 0.0);
    stage.memory_bytes = profile::stage_memory_bytes(m, policy);
    if (stage.summary.empty()) stage.summary = summarize_tasks(graph, stage.tasks);
    slowest = std::max(slowest, stage.forward_seconds + stage.backward_seconds);
    const int group = stage.replicas * plan.pipeline_copies;
    allreduce = std::max(allreduce, cost.allreduce_seconds(m.parameter_bytes, group, spans_nodes(cost, group)));
  }
  plan.predicted_step_seconds = (plan.microbatches + stage_count - 1) * slowest + allreduce;
  plan.device_memory_bytes = cost.device().memory_bytes;
  plan.cost_model = cost.description();
}

double memory_excess_bytes(const Plan& plan, const CostModel& cost, const PlannerOptions& options) {
  double largest = 0.0;
  for (const PlanStage& stage : plan.stages) largest = std::max(largest, stage.memory_bytes);
  return largest - options.usable_memory_bytes(cost.device());
}

std::vector<int> equal_replicas(int world_size, int stage_count) {
  PARTRAIN_CHECK(stage_count > 0 && stage_count <= world_size,
                 stage_count << " stages cannot be placed on " << world_size << " devices");
  PARTRAIN_CHECK(world_size % stage_count == 0,
                 stage_count << " stages do not divide the " << world_size << " devices evenly");
  return std::vector<int>(stage_count, world_size / stage_count);
}

Plan plan_from_stages(const Graph& graph, std::vector<std::vector<int>> stage_tasks, std::vector<int> replicas,
                      const CostModel& cost, const PlannerOptions& options, const std::string& planner) {
  PARTRAIN_CHECK(!stage_tasks.empty() && stage_tasks.size() == replicas.size(),
                 planner << ": " << stage_tasks.size() << " stages but " << replicas.size() << " replica counts");
  Plan base;
  base.planner = planner;
  base.graph_hash = graph.hash();
  base.global_batch = options.global_batch;
  base.schedule = options.schedule;
  for (std::size_t s = 0; s < stage_tasks.size(); ++s) {
    PlanStage stage;
    stage.tasks = std::move(stage_tasks[s]);
    std::sort(stage.tasks.begin(), stage.tasks.end());
    stage.replicas = replicas[s];
    stage.summary = summarize_tasks(graph, stage.tasks);
    base.stages.push_back(std::move(stage));
  }
  const int devices = base.devices_per_copy();
  PARTRAIN_CHECK(devices > 0 && options.world_size % devices == 0,
                 planner << ": " << devices << " devices per pipeline copy do not divide the world size "
                         << options.world_size);
  base.pipeline_copies = options.world_size / devices;
  base.world_size = options.world_size;
  int widest = 0;
  for (int r : replicas) widest = std::max(widest, r);

  std::vector<int> candidates;
  if (options.microbatches > 0) {
    candidates.push_back(options.microbatches);
  } else {
    for (int m = 1; m <= options.max_microbatches; m *= 2) candidates.push_back(m);
  }
  Plan best;
  bool found = false;
  double least_memory = std::numeric_limits<double>::infinity();
  std::string last_problem;
  for (int microbatches : candidates) {
    const std::int64_t per_copy_microbatches = static_cast<std::int64_t>(base.pipeline_copies) * microbatches;
    if (options.global_batch % per_copy_microbatches != 0 || options.global_batch / per_copy_microbatches < widest) {
      last_problem = "the global batch " + std::to_string(options.global_batch) + " does not split into " +
                     std::to_string(base.pipeline_copies) + " pipeline copies x " + std::to_string(microbatches) +
                     " microbatches of at least " + std::to_string(widest) + " samples";
      continue;
    }
    Plan candidate = base;
    candidate.microbatches = microbatches;
    predict_plan(candidate, graph, cost, options);
    const double excess = memory_excess_bytes(candidate, cost, options);
    least_memory = std::min(least_memory, excess + options.usable_memory_bytes(cost.device()));
    if (excess > 0) continue;
    if (!found || candidate.predicted_step_seconds < best.predicted_step_seconds) {
      best = std::move(candidate);
      found = true;
    }
  }
  if (!found) {
    PARTRAIN_CHECK(std::isfinite(least_memory), planner << ": no plan: " << last_problem);
    const double needed = least_memory / (1.0 - options.memory_margin);
    PARTRAIN_FAIL(planner << ": the plan does not fit in " << cost.device().memory_bytes / (1ull << 30)
                          << " GiB per device; it needs at least " << std::ceil(needed / (1ull << 20)) / 1024.0
                          << " GiB per device (with memory_margin " << options.memory_margin
                          << "), or more devices");
  }
  best.validate(graph);
  return best;
}

}  // namespace partrain::partition
