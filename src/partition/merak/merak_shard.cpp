// Merak graph sharding (Lai et al., TPDS 2023) and the merak planner. See merak_shard.h.
#include "partition/merak/merak_shard.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "core/error.h"
#include "partition/common/plan_builder.h"
#include "partition/common/microbatches.h"

namespace partrain::partition {

namespace {

// Params that a Gather task looks up (embedding tables).
std::vector<bool> embedding_tables(const Graph& graph) {
  std::vector<bool> table(graph.values().size(), false);
  for (const Task& task : graph.tasks()) {
    if (task.op != OpType::Gather) continue;
    for (int input : task.inputs)
      if (graph.value(input).kind == ValueKind::Param) table[input] = true;
  }
  return table;
}

std::int64_t elements(const Graph& graph, int value) { return numel(graph.value(value).type.shape); }

}  // namespace

std::vector<int> merak_common_nodes(const Graph& graph, int uses) {
  PARTRAIN_CHECK(uses >= 0, "merak: common-node threshold " << uses << " (must be >= 0)");
  std::vector<int> common;
  for (const Task& task : graph.tasks()) {
    if (task.constant) continue;
    std::size_t total = 0;
    for (int output : task.outputs) total += graph.value(output).consumers.size();
    if (total > static_cast<std::size_t>(uses)) common.push_back(task.id);
  }
  return common;
}

std::int64_t merak_parameter_threshold(const Graph& graph, int shard_count) {
  PARTRAIN_CHECK(shard_count >= 1, "merak: shard count " << shard_count << " (must be >= 1)");
  const std::vector<bool> table = embedding_tables(graph);
  std::int64_t total = 0;
  for (int p : graph.parameters())
    if (!table[p]) total += elements(graph, p);
  return std::max<std::int64_t>(1, total / shard_count);
}

std::vector<MerakShard> merak_shards(const Graph& graph, const MerakShardOptions& options) {
  const std::vector<Task>& tasks = graph.tasks();
  PARTRAIN_CHECK(!tasks.empty(), "merak: the graph has no tasks");
  const int shard_count = options.shard_count > 0 ? options.shard_count
                                                  : static_cast<int>(layer_groups(graph).size());
  const std::int64_t threshold =
      options.parameter_threshold > 0 ? options.parameter_threshold : merak_parameter_threshold(graph, shard_count);
  const std::vector<bool> table = embedding_tables(graph);
  std::vector<bool> common(tasks.size(), false);
  for (int t : merak_common_nodes(graph, options.common_node_uses)) common[t] = true;

  // Parameters each task reads, directly or through the constant tasks feeding it; whether a
  // non-constant task is an embedding lookup (a Gather of a table, or fed by a constant one).
  std::vector<std::vector<int>> params(tasks.size());
  std::vector<bool> lookup(tasks.size(), false);
  for (const Task& task : tasks) {
    std::vector<int>& mine = params[task.id];
    for (int input : task.inputs) {
      const Value& value = graph.value(input);
      if (value.kind == ValueKind::Param) {
        mine.push_back(input);
        if (task.op == OpType::Gather) lookup[task.id] = true;
      } else if (value.producer >= 0 && tasks[value.producer].constant) {
        mine.insert(mine.end(), params[value.producer].begin(), params[value.producer].end());
        if (lookup[value.producer]) lookup[task.id] = true;
      }
    }
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  }
  auto counted = [&](const std::set<int>& shard_params) {
    std::int64_t sum = 0;
    for (int p : shard_params) sum += table[p] ? threshold + 1 : elements(graph, p);
    return sum;
  };

  // Algorithm 1 with the farthest-dependency search of Algorithm 2.
  std::vector<int> shard_of(tasks.size(), -1);
  std::vector<int> walked;                      // non-constant tasks in walk order
  std::vector<int> output_of{-1};               // per shard: the task it closed after (−1: open)
  std::vector<std::set<int>> shard_params(1);
  int current = 0;
  for (const Task& task : tasks) {
    if (task.constant) continue;
    int farthest = current;
    for (int input : task.inputs) {
      const int producer = graph.value(input).producer;
      if (producer < 0 || tasks[producer].constant || common[producer]) continue;
      const int k = shard_of[producer];
      if (k == current) continue;
      const int needed = output_of[k] == producer ? (k == current - 1 ? current : k + 1) : k;
      farthest = std::min(farthest, needed);
    }
    if (farthest < current) {   // collapse shards farthest..current into one
      for (auto t = walked.rbegin(); t != walked.rend() && shard_of[*t] > farthest; ++t) shard_of[*t] = farthest;
      for (int k = farthest + 1; k <= current; ++k) shard_params[farthest].insert(shard_params[k].begin(), shard_params[k].end());
      shard_params.resize(farthest + 1);
      output_of.resize(farthest + 1);
      output_of[farthest] = -1;
      current = farthest;
    }
    shard_of[task.id] = current;
    walked.push_back(task.id);
    shard_params[current].insert(params[task.id].begin(), params[task.id].end());
    if (counted(shard_params[current]) > threshold && !lookup[task.id]) {
      output_of[current] = task.id;
      ++current;
      output_of.push_back(-1);
      shard_params.emplace_back();
    }
  }
  if (!walked.empty() && shard_of[walked.back()] < current) {   // closed on the last task: no empty shard
    --current;
    output_of[current] = -1;
  }
  const int shard_total = current + 1;
  std::vector<MerakShard> shards(shard_total);
  for (int t : walked) shards[shard_of[t]].tasks.push_back(t);
  for (int s = 0; s < shard_total; ++s) shards[s].output_task = output_of[s];
  // Constant tasks: cloned into every shard that consumes them, directly or through constant tasks.
  std::vector<std::vector<int>> constant_shards(tasks.size());
  for (auto task = tasks.rbegin(); task != tasks.rend(); ++task) {
    if (!task->constant) continue;
    std::vector<int>& into = constant_shards[task->id];
    for (int output : task->outputs) {
      for (int consumer : graph.value(output).consumers) {
        if (shard_of[consumer] >= 0) into.push_back(shard_of[consumer]);
        into.insert(into.end(), constant_shards[consumer].begin(), constant_shards[consumer].end());
      }
    }
    std::sort(into.begin(), into.end());
    into.erase(std::unique(into.begin(), into.end()), into.end());
    if (into.empty()) into.push_back(shard_total - 1);
    for (int s : into) shards[s].tasks.push_back(task->id);
  }
  for (MerakShard& shard : shards) {
    std::sort(shard.tasks.begin(), shard.tasks.end());
    std::set<int> read;
    for (int t : shard.tasks) read.insert(params[t].begin(), params[t].end());
    for (int p : read) shard.parameter_count += elements(graph, p);
    shard.counted_parameters = counted(read);
  }
  return shards;
}

std::vector<std::pair<std::size_t, std::size_t>> balanced_contiguous_ranges(const std::vector<double>& shard_costs,
                                                                            int stages) {
  const int n = static_cast<int>(shard_costs.size());
  PARTRAIN_CHECK(stages >= 1, "merak: " << stages << " stages");
  PARTRAIN_CHECK(stages <= n, "merak: " << stages << " stages but the model has only " << n << " shards");
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + shard_costs[i];
  const double infinity = std::numeric_limits<double>::infinity();
  // best[s][j]: least largest cost of the first j shards in s stages; cut[s][j]: start of stage s.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, infinity));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int j = s; j <= n - (stages - s); ++j) {
      for (int i = s - 1; i < j; ++i) {
        const double value = std::max(best[s - 1][i], prefix[j] - prefix[i]);
        if (value < best[s][j]) {
          best[s][j] = value;
          cut[s][j] = i;
        }
      }
    }
  }
  std::vector<std::pair<std::size_t, std::size_t>> ranges(stages);
  int end = n;
  for (int s = stages; s >= 1; --s) {
    ranges[s - 1] = {static_cast<std::size_t>(cut[s][end]), static_cast<std::size_t>(end)};
    end = cut[s][end];
  }
  return ranges;
}

namespace {
// The merak plan of `stages` stages over `shards`: shard costs at the stage count's per-replica
// microbatch, grouped into balanced contiguous stages, then plan_from_stages (microbatches,
// prediction, memory check; throws when nothing fits).
Plan merak_plan_with_stages(const Graph& graph, const std::vector<MerakShard>& shards, const CostModel& cost,
                            const PlannerOptions& options, int stages) {
  const std::vector<int> replicas = equal_replicas(options.world_size, stages);
  const int microbatches = planning_microbatches(options, stages, replicas);
  const std::int64_t batch = replica_microbatch(options, replicas[0], replicas, microbatches);
  std::vector<double> seconds;
  for (const MerakShard& shard : shards) {
    const profile::Measurement m = cost.measure(shard.tasks, batch);
    seconds.push_back(m.forward_seconds + m.backward_seconds);
  }
  std::vector<std::vector<int>> stage_tasks;
  for (const auto& [first, last] : balanced_contiguous_ranges(seconds, stages)) {
    std::vector<int> tasks;
    for (std::size_t s = first; s < last; ++s) tasks.insert(tasks.end(), shards[s].tasks.begin(), shards[s].tasks.end());
    std::sort(tasks.begin(), tasks.end());
    tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
    stage_tasks.push_back(std::move(tasks));
  }
  return plan_from_stages(graph, std::move(stage_tasks), replicas, cost, options, "merak");
}
}  // namespace

Plan plan_merak(const Graph& graph, const CostModel& cost, const PlannerOptions& requested) {
  PARTRAIN_CHECK(requested.world_size >= 1, "merak: world size " << requested.world_size);
  // Left to the planner, the activation policy is Merak's own (§6.2): stage-aware recomputation,
  // each stage keeping the activations of as many layers as its memory holds (all of them when
  // everything fits, none when nothing does).
  PlannerOptions options = requested;
  if (options.recompute == "auto") options.recompute = "stage_aware";
  const std::vector<MerakShard> shards = merak_shards(graph);
  const int n = static_cast<int>(shards.size());
  if (options.stages > 0) {
    PARTRAIN_CHECK(options.stages <= n, "merak: " << options.stages << " stages but the model has only " << n << " shards");
    return merak_plan_with_stages(graph, shards, cost, options, options.stages);
  }
  // Merak's planner searches the pipeline degree with the other degrees (§4: the 3D layout with the
  // best predicted throughput): every stage count dividing the world size, at most one per shard,
  // keeping the fastest predicted plan that fits. The deepest pipeline is not always best: the
  // bubble grows with the stage count and the last stage may hold little more than the loss.
  std::optional<Plan> best;
  std::string problems;
  for (int stages = 1; stages <= std::min(options.world_size, n); ++stages) {
    if (options.world_size % stages != 0) continue;
    try {
      Plan plan = merak_plan_with_stages(graph, shards, cost, options, stages);
      if (!best || plan.predicted_step_seconds < best->predicted_step_seconds) best = std::move(plan);
    } catch (const Error& error) {
      problems += "\n  " + std::to_string(stages) + " stages: " + error.message();
    }
  }
  PARTRAIN_CHECK(best.has_value(), "merak: no stage count gives a plan that fits:" << problems);
  return *best;
}

}  // namespace partrain::partition
