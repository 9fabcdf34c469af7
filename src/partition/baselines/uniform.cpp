// The uniform (Megatron-LM / DeepSpeed) planner. See uniform.h.
#include "partition/baselines/uniform.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>

#include "core/error.h"

namespace partrain::partition {

bool is_repeated_layer(const std::string& layer_name) {
  const std::size_t dot = layer_name.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == layer_name.size()) return false;
  return std::all_of(layer_name.begin() + static_cast<std::ptrdiff_t>(dot) + 1, layer_name.end(),
                     [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::vector<std::pair<std::size_t, std::size_t>> uniform_stage_ranges(const std::vector<LayerGroup>& groups, int stages) {
  std::vector<std::size_t> repeated;
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (is_repeated_layer(groups[g].name)) repeated.push_back(g);
  if (repeated.empty())
    for (std::size_t g = 0; g < groups.size(); ++g) repeated.push_back(g);
  const int count = static_cast<int>(repeated.size());
  PARTRAIN_CHECK(stages >= 1, "uniform: " << stages << " stages");
  PARTRAIN_CHECK(stages <= count, "uniform: " << stages << " stages but the model has only " << count
                                              << " repeated layers to split");
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  std::size_t taken = 0;   // repeated groups dealt so far
  for (int s = 0; s < stages; ++s) {
    const std::size_t first = s == 0 ? 0 : repeated[taken];
    taken += static_cast<std::size_t>(count / stages + (s < count % stages ? 1 : 0));
    const std::size_t last = s + 1 == stages ? groups.size() : repeated[taken];
    ranges.emplace_back(first, last);
  }
  return ranges;
}

namespace {

// The layers uniform_stage_ranges deals out: the repeated ones, or every group when none repeats.
int dealt_layers(const std::vector<LayerGroup>& groups) {
  int repeated = 0;
  for (const LayerGroup& group : groups) repeated += is_repeated_layer(group.name) ? 1 : 0;
  return repeated == 0 ? static_cast<int>(groups.size()) : repeated;
}

// Interleaved with virtual_stages = 0: every v from 1 (plain 1F1B) to layers / S, each planned
// as below, and the plan predicted fastest among those that fit (ties: the smaller v, fewer
// messages). Megatron-LM leaves v to the user; the simulator prices its bubble (S − 1)/(v·M)
// against the v-fold point-to-point traffic, so the planner can choose.
Plan plan_uniform_choosing_chunks(const Graph& graph, const CostModel& cost, const PlannerOptions& options,
                                  const std::vector<LayerGroup>& groups) {
  // v = 1 is plain 1F1B (the interleaved order with one chunk is 1F1B's, without its constraint
  // that the microbatches be a multiple of the pipeline depth).
  PlannerOptions fixed = options;
  fixed.virtual_stages = 1;
  fixed.schedule = ScheduleKind::OneForwardOneBackward;
  std::optional<Plan> best;
  std::string problems;
  if (fixed.stages <= 0) {  // S as for v = 1, whose plan is then the first candidate
    best = plan_uniform(graph, cost, fixed);
    fixed.stages = best->pipeline_stages();
  }
  for (int v = best ? 2 : 1; v * fixed.stages <= dealt_layers(groups); ++v) {
    if (v > 1 && fixed.stages < 2) break;
    fixed.virtual_stages = v;
    fixed.schedule = v == 1 ? ScheduleKind::OneForwardOneBackward : ScheduleKind::Interleaved;
    try {
      Plan plan = plan_uniform(graph, cost, fixed);
      if (!best || plan.predicted_step_seconds < best->predicted_step_seconds * (1 - 1e-9)) best = std::move(plan);
    } catch (const Error& error) {
      problems += "\n  virtual_stages = " + std::to_string(v) + ": " + error.message();
    }
  }
  PARTRAIN_CHECK(best.has_value(), "uniform: no number of model chunks per rank gives a plan:" << problems);
  return *std::move(best);
}

}  // namespace

Plan plan_uniform(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const std::vector<LayerGroup> groups = layer_groups(graph);
  PARTRAIN_CHECK(options.world_size >= 1, "uniform: world size " << options.world_size);
  if (options.schedule == ScheduleKind::Interleaved && options.virtual_stages == 0)
    return plan_uniform_choosing_chunks(graph, cost, options, groups);
  const int v = schedule_has_chunks(options.schedule) ? std::max(1, options.virtual_stages) : 1;
  int stages = options.stages;
  if (stages <= 0) {
    stages = std::max(1, std::min(options.world_size, dealt_layers(groups) / v));
    while (stages > 1 && options.world_size % stages != 0) --stages;
  }
  // Interleaved: S·v model chunks of near-equal layer counts, chunk c on pipeline stage c mod S.
  PARTRAIN_CHECK(v == 1 || stages >= 2, "uniform: the interleaved schedule with virtual_stages = " << v
                                                                                                   << " needs at least 2 pipeline stages, not " << stages);
  const std::vector<std::pair<std::size_t, std::size_t>> ranges = uniform_stage_ranges(groups, stages * v);
  const std::vector<int> stage_replicas = equal_replicas(options.world_size, stages);
  std::vector<int> replicas;
  for (int c = 0; c < stages * v; ++c) replicas.push_back(stage_replicas[stage_of_chunk(options.schedule, c, stages)]);
  std::vector<std::vector<int>> stage_tasks;
  for (const auto& [first, last] : ranges) stage_tasks.push_back(join_groups(groups, first, last));
  return plan_from_stages(graph, std::move(stage_tasks), replicas, cost, options, "uniform");
}

}  // namespace partrain::partition
