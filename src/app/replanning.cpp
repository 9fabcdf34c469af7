#include "app/replanning.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/statistics.h"
#include "plan/schedule.h"
#include "plan/schedule_simulator.h"
#include "plan/schedule_topology.h"

namespace partrain::app {
namespace {

// The action kind and local model chunk of a trace event named "Forward mb 3" or "Backward mb 3
// chunk 1"; an empty kind for events that are not per-microbatch compute.
std::pair<std::string, int> kind_and_chunk(const io::TraceEvent& event) {
  if (event.category != "compute") return {"", 0};
  std::istringstream words(event.name);
  std::string kind, word;
  words >> kind;
  int chunk = 0;
  while (words >> word)
    if (word == "chunk") words >> chunk;
  return {kind, chunk};
}

// A plan's layout without its predictions: what a switch would change.
nlohmann::json layout_of(const Plan& plan) {
  nlohmann::json layout = plan.to_json();
  for (const char* key : {"predicted_step_seconds", "predicted_bubble_fraction", "cost_model", "planner"})
    layout.erase(key);
  nlohmann::json stages = nlohmann::json::array();
  for (const PlanStage& stage : plan.stages)
    stages.push_back({{"tasks", stage.tasks}, {"replicas", stage.replicas}, {"recompute", recompute_name(stage.recompute)}});
  layout["stages"] = stages;
  return layout;
}

}  // namespace

std::map<int, MeasuredStageCosts> measured_stage_costs(const std::vector<io::TraceEvent>& trace, const Plan& plan,
                                                       int rank, std::int64_t first_step, std::int64_t end_step) {
  // (global chunk, kind) -> durations; a stage's backward is the sum of its kinds' medians.
  std::map<std::pair<int, std::string>, std::vector<double>> seconds;
  for (const io::TraceEvent& event : trace) {
    if (event.step < first_step || event.step >= end_step) continue;
    const auto [kind, chunk] = kind_and_chunk(event);
    if (kind.empty()) continue;
    seconds[{global_chunk(plan, rank, chunk), kind}].push_back(event.duration_us / 1e6);
  }
  std::map<int, MeasuredStageCosts> costs;
  for (const auto& [key, values] : seconds) {
    const auto& [stage, kind] = key;
    if (!seconds.count({stage, "Forward"})) continue;
    MeasuredStageCosts& cost = costs[stage];
    if (kind == "Forward") cost.forward_seconds = median(values);
    else if (kind == "Backward" || kind == "BackwardInput" || kind == "BackwardWeight" || kind == "Recompute")
      cost.backward_seconds += median(values);
  }
  return costs;
}

std::map<int, MeasuredStageCosts> gather_stage_costs(const std::map<int, MeasuredStageCosts>& mine,
                                                     comm::Communicator& world) {
  nlohmann::json part = nlohmann::json::array();
  for (const auto& [stage, cost] : mine) part.push_back({stage, cost.forward_seconds, cost.backward_seconds});
  const std::vector<std::string> parts = world.gather_bytes(part.dump(), 0);
  std::map<int, std::pair<std::vector<double>, std::vector<double>>> by_stage;
  for (const std::string& text : parts)
    for (const nlohmann::json& entry : nlohmann::json::parse(text)) {
      auto& [forward, backward] = by_stage[entry[0].get<int>()];
      forward.push_back(entry[1].get<double>());
      backward.push_back(entry[2].get<double>());
    }
  std::map<int, MeasuredStageCosts> combined;
  for (auto& [stage, values] : by_stage) combined[stage] = {median(values.first), median(values.second)};
  return combined;
}

std::map<int, MeasuredStageCosts> predicted_stage_costs(const Plan& plan) {
  std::map<int, MeasuredStageCosts> costs;
  const TimelineCosts timeline_costs = TimelineCosts::from_plan(plan);
  if (!timeline_costs.shares_cores()) {
    for (std::size_t s = 0; s < plan.stages.size(); ++s)
      costs[static_cast<int>(s)] = {plan.stages[s].forward_seconds, plan.stages[s].backward_seconds};
    return costs;
  }
  const Schedule schedule = generate_schedule(plan);
  const TimelinePrediction prediction = simulate_schedule(plan, schedule, timeline_costs);
  std::map<std::pair<int, ActionKind>, std::vector<double>> seconds;  // (global chunk, kind) -> durations
  for (std::size_t r = 0; r < schedule.size(); ++r)
    for (std::size_t k = 0; k < schedule[r].size(); ++k) {
      const Action& action = schedule[r][k];
      if (!action.is_compute()) continue;
      const ActionTiming& timing = prediction.timing[r][k];
      seconds[{global_chunk(plan, static_cast<int>(r), action.chunk), action.kind}].push_back(timing.end - timing.start);
    }
  for (const auto& [key, values] : seconds) {
    MeasuredStageCosts& cost = costs[key.first];
    (key.second == ActionKind::Forward ? cost.forward_seconds : cost.backward_seconds) += median(values);
  }
  return costs;
}

std::map<int, profile::TimeCorrection> stage_corrections(const Plan& plan,
                                                         const std::map<int, MeasuredStageCosts>& measured) {
  std::map<int, profile::TimeCorrection> corrections;
  const std::map<int, MeasuredStageCosts> expected = predicted_stage_costs(plan);
  for (const auto& [stage, cost] : measured) {
    if (stage < 0 || stage >= static_cast<int>(plan.stages.size())) continue;
    const MeasuredStageCosts& predicted = expected.at(stage);
    profile::TimeCorrection correction;
    if (predicted.forward_seconds > 0 && cost.forward_seconds > 0)
      correction.forward = cost.forward_seconds / predicted.forward_seconds;
    if (predicted.backward_seconds > 0 && cost.backward_seconds > 0)
      correction.backward = cost.backward_seconds / predicted.backward_seconds;
    corrections[stage] = correction;
  }
  return corrections;
}

void correct_profile(profile::ProfileDB& database, const Plan& plan,
                     const std::map<int, profile::TimeCorrection>& corrections) {
  std::unordered_map<int, int> stage_of_task;  // constant tasks cloned into several stages: the first
  for (std::size_t s = 0; s < plan.stages.size(); ++s)
    for (int task : plan.stages[s].tasks) stage_of_task.try_emplace(task, static_cast<int>(s));
  database.correct_times([&](std::span<const int> tasks, std::int64_t batch) {
    std::map<int, int> count;  // stage -> tasks of the set it holds
    for (int task : tasks)
      if (auto found = stage_of_task.find(task); found != stage_of_task.end()) ++count[found->second];
    if (count.empty()) return profile::TimeCorrection{};
    const int stage = std::max_element(count.begin(), count.end(), [](const auto& a, const auto& b) {
                        return a.second < b.second;
                      })->first;
    auto found = corrections.find(stage);
    if (found == corrections.end()) return profile::TimeCorrection{};
    // The size the run's microbatch is priced from (the profiled one above it where it was not
    // profiled itself), and every smaller one.
    const auto [begin, end] = plan.replica_samples(stage, 0);
    const std::int64_t ran = end - begin;
    const std::vector<std::int64_t> profiled = database.batches(tasks);
    auto above = std::lower_bound(profiled.begin(), profiled.end(), ran);
    const std::int64_t upper = above == profiled.end() ? profiled.back() : *above;
    return batch <= upper ? found->second : profile::TimeCorrection{};
  });
}

std::string describe_corrections(double measured_seconds, double predicted_seconds, double threshold,
                                 const std::map<int, profile::TimeCorrection>& corrections) {
  char head[200];
  std::snprintf(head, sizeof head, "replan: step time measured %.4f s, predicted %.4f s (%+.1f%%, threshold %.0f%%)",
                measured_seconds, predicted_seconds, 100.0 * (measured_seconds / predicted_seconds - 1.0),
                100.0 * threshold);
  std::ostringstream line;
  line << head << "; stage costs measured/predicted:";
  for (const auto& [stage, correction] : corrections) {
    char part[100];
    std::snprintf(part, sizeof part, " %d forward %.2f backward %.2f%s", stage, correction.forward, correction.backward,
                  std::next(corrections.find(stage)) == corrections.end() ? "" : ",");
    line << part;
  }
  return line.str();
}

bool same_layout(const Plan& a, const Plan& b) { return layout_of(a) == layout_of(b); }

}  // namespace partrain::app
