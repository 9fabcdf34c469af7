#include "plan/schedule_simulator.h"

#include <algorithm>

#include "core/error.h"
#include "plan/schedule_runner.h"
#include "plan/shared_core_timeline.h"
#include "plan/schedule_topology.h"

namespace partrain {
namespace {

void check_costs(const Plan& plan, const TimelineCosts& costs) {
  const std::size_t S = plan.stages.size();
  PARTRAIN_CHECK(costs.forward_seconds.size() == S && costs.backward_seconds.size() == S &&
                     costs.recompute_seconds.size() == S,
                 "simulate_schedule: costs need one entry per stage (" << S << "), got forward "
                                                                       << costs.forward_seconds.size() << ", backward "
                                                                       << costs.backward_seconds.size() << ", recompute "
                                                                       << costs.recompute_seconds.size());
  for (std::size_t s = 0; s < S; ++s)
    PARTRAIN_CHECK(costs.forward_seconds[s] >= 0 && costs.backward_seconds[s] >= 0 && costs.recompute_seconds[s] >= 0,
                   "simulate_schedule: negative cost for stage " << s);
  PARTRAIN_CHECK(costs.step_seconds >= 0, "simulate_schedule: negative step time");
  PARTRAIN_CHECK(costs.stage_step_seconds.empty() || costs.stage_step_seconds.size() == S,
                 "simulate_schedule: " << costs.stage_step_seconds.size() << " stage step times for " << S << " stages");
  PARTRAIN_CHECK(costs.weight_gradient_seconds.empty() || costs.weight_gradient_seconds.size() == S,
                 "simulate_schedule: " << costs.weight_gradient_seconds.size() << " weight-gradient times for " << S
                                       << " stages");
  for (std::size_t s = 0; s < costs.weight_gradient_seconds.size(); ++s)
    PARTRAIN_CHECK(costs.weight_gradient_seconds[s] >= 0 && costs.weight_gradient_seconds[s] <= costs.backward_seconds[s],
                   "simulate_schedule: stage " << s << "'s weight-gradient time is not within its backward time");
  for (double seconds : costs.stage_step_seconds)
    PARTRAIN_CHECK(seconds >= 0, "simulate_schedule: negative step time");
  PARTRAIN_CHECK(costs.tied_all_reduce_seconds.empty() || costs.tied_all_reduce_seconds.size() == S,
                 "simulate_schedule: " << costs.tied_all_reduce_seconds.size() << " tied all-reduce times for " << S
                                       << " stages");
  for (double seconds : costs.tied_all_reduce_seconds)
    PARTRAIN_CHECK(seconds >= 0, "simulate_schedule: negative tied all-reduce time");
}

// The prediction of a finished run: each rank's end, its compute seconds, the pipeline's end.
TimelinePrediction summarize(const Schedule& schedule, const std::vector<double>& clock,
                             std::vector<std::vector<ActionTiming>> timing) {
  TimelinePrediction prediction;
  const std::size_t ranks = schedule.size();
  prediction.rank_compute_seconds.assign(ranks, 0.0);
  double busy = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    prediction.step_seconds = std::max(prediction.step_seconds, clock[r]);
    for (std::size_t k = 0; k < schedule[r].size(); ++k) {
      if (!schedule[r][k].is_compute()) continue;
      const ActionTiming& t = timing[r][k];
      prediction.rank_compute_seconds[r] += t.end - t.start;
      prediction.pipeline_seconds = std::max(prediction.pipeline_seconds, t.end);
    }
    busy += prediction.rank_compute_seconds[r];
  }
  if (prediction.pipeline_seconds > 0)
    prediction.bubble_fraction = std::max(0.0, 1.0 - busy / (static_cast<double>(ranks) * prediction.pipeline_seconds));
  prediction.timing = std::move(timing);
  return prediction;
}

}  // namespace

TimelineCosts TimelineCosts::from_plan(const Plan& plan) {
  TimelineCosts costs;
  std::vector<double> all_reduce;
  for (const PlanStage& stage : plan.stages) {
    all_reduce.push_back(std::max(0.0, stage.allreduce_seconds - stage.allreduce_hidden_seconds));
    costs.stage_step_seconds.push_back(stage.optimizer_seconds);
    costs.tied_all_reduce_seconds.push_back(stage.tied_allreduce_seconds);
    // Per-layer and selective recomputation happen inside the backward, which is charged whole.
    const bool recomputes = recomputes_before_backward(stage.recompute);
    costs.forward_seconds.push_back(stage.forward_seconds);
    costs.recompute_seconds.push_back(recomputes ? stage.forward_seconds : 0.0);
    costs.backward_seconds.push_back(
        recomputes ? std::max(0.0, stage.backward_seconds - stage.forward_seconds) : stage.backward_seconds);
    costs.weight_gradient_seconds.push_back(std::min(stage.weight_gradient_seconds, costs.backward_seconds.back()));
  }
  costs.all_reduce_seconds = [all_reduce](int stage) { return all_reduce.at(stage); };
  costs.synchronized_step = true;
  costs.ranks_per_node = plan.ranks_per_node;
  costs.concurrent_ranks_per_node = plan.concurrent_ranks_per_node;
  return costs;
}

TimelinePrediction simulate_schedule(const Plan& plan, const Schedule& schedule, const TimelineCosts& costs) {
  if (costs.shares_cores()) return simulate_schedule_on_shared_cores(plan, schedule, costs);
  check_plan_shape(plan);
  check_costs(plan, costs);
  Runner runner(plan, schedule, &costs);
  runner.run();
  return summarize(schedule, runner.clock, std::move(runner.timing));
}

TimelinePrediction simulate_schedule_on_shared_cores(const Plan& plan, const Schedule& schedule,
                                                     const TimelineCosts& costs) {
  check_plan_shape(plan);
  check_costs(plan, costs);
  PARTRAIN_CHECK(costs.ranks_per_node >= 0 && costs.concurrent_ranks_per_node >= 0,
                 "simulate_schedule: negative ranks per node (" << costs.ranks_per_node << ") or concurrent ranks ("
                                                                << costs.concurrent_ranks_per_node << ")");
  Runner paired(plan, schedule, &costs);  // checks the lists and pairs each receive with its send
  paired.run();
  SharedCoreTimeline timeline(paired);
  timeline.run();
  return summarize(schedule, timeline.clock, std::move(timeline.timing));
}

}  // namespace partrain
