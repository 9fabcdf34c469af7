#pragma once
// The timeline simulator: every rank's action list run together with per-stage compute costs,
// transfer and all-reduce costs, predicting one optimizer step's time and its bubble fraction.
#include <cstdint>
#include <functional>
#include <vector>

#include "plan/plan.h"
#include "plan/schedule.h"

namespace partrain {

/// Costs the timeline simulator charges (seconds).
struct TimelineCosts {
  /// Per Plan::stages entry (a stage, or a model chunk under the interleaved schedule): one
  /// microbatch's forward / backward (without recomputation) / recomputation on one replica.
  std::vector<double> forward_seconds;
  std::vector<double> backward_seconds;
  std::vector<double> recompute_seconds;
  /// Per Plan::stages entry, optional (empty: 0): the part of backward_seconds a BackwardWeight
  /// runs; a BackwardInput runs the rest, a whole Backward all of it.
  std::vector<double> weight_gradient_seconds;
  /// Seconds from posting a send of `samples` samples to its arrival at `to_rank`; empty: 0.
  std::function<double(ActionKind kind, int from_rank, int to_rank, std::int64_t samples)> transfer_seconds;
  /// Seconds of a stage's (Plan::stages entry's) gradient all-reduce once all members arrived; a rank
  /// holding several model chunks is charged the sum over them; empty: 0.
  std::function<double(int stage)> all_reduce_seconds;
  /// Seconds of the optimizer step; per Plan::stages entry when `stage_step_seconds` is not empty (a
  /// rank's Step costs the sum over its model chunks).
  double step_seconds = 0;
  std::vector<double> stage_step_seconds;
  /// Optional: seconds of compute or Step action `index` of `rank`'s list, replacing the per-stage
  /// costs above (e.g. the durations a run's trace measured).
  std::function<double(int rank, std::size_t index)> action_seconds;
  /// Whether Step is the world barrier the runtime's optimizer step makes (the gradient norm's
  /// all-reduce over every rank): each rank's optimizer starts when the last rank reached its Step
  /// (after the tied all-reduce below), instead of when the rank itself did. Off for measured
  /// Step durations, which already hold the wait.
  bool synchronized_step = false;
  /// Per Plan::stages entry, optional (empty: none): seconds of the Step's all-reduce of the
  /// parameters the stage shares with other pipeline stages (PlanStage::tied_allreduce_seconds),
  /// collective over the ranks of every stage with a non-zero entry, before the barrier.
  std::vector<double> tied_all_reduce_seconds;
  /// Ranks sharing a node's cores (optional; 0: every rank has cores of its own, the default):
  /// `ranks_per_node` consecutive ranks on each node, of which `concurrent_ranks_per_node` can
  /// compute at full speed at once (the node's cores over each rank's threads). When a node holds
  /// more, the compute and Step costs above are seconds on cores of the rank's own, and the ranks
  /// computing at a moment share the node's cores (simulate_schedule_on_shared_cores).
  int ranks_per_node = 0;
  double concurrent_ranks_per_node = 0;
  /// True when ranks_per_node exceeds concurrent_ranks_per_node (both set).
  bool shares_cores() const {
    return ranks_per_node > 0 && concurrent_ranks_per_node > 0 && ranks_per_node > concurrent_ranks_per_node;
  }

  /// From the plan's predictions: forward = PlanStage::forward_seconds; weight gradients =
  /// PlanStage::weight_gradient_seconds; for a recomputing stage
  /// recompute = forward_seconds and backward = backward_seconds − forward_seconds (the plan's backward
  /// includes the recomputation), otherwise recompute = 0 and backward = backward_seconds;
  /// all-reduce = PlanStage::allreduce_seconds − allreduce_hidden_seconds (what is left after the last backward); step = PlanStage::optimizer_seconds;
  /// tied all-reduce = PlanStage::tied_allreduce_seconds; a synchronized step. No separate transfer costs: the planners fold a
  /// stage's boundary transfers into its forward and backward (on MPI the copies occupy the rank).
  static TimelineCosts from_plan(const Plan& plan);
};

/// Start and end (seconds from the step's start) of one action on one rank.
struct ActionTiming {
  double start = 0;
  double end = 0;
};

/// What simulate_schedule predicts for one optimizer step.
struct TimelinePrediction {
  double step_seconds = 0;      // until the last rank finished Step
  double pipeline_seconds = 0;  // until the last Forward/Backward/Recompute ended on any rank
  /// 1 − (Σ over ranks of compute seconds) / (ranks × pipeline_seconds): the idle share of the
  /// pipeline phase (GPipe, equal stage times, free transfers: (S−1)/(M+S−1)).
  double bubble_fraction = 0;
  std::vector<double> rank_compute_seconds;       // per rank: Σ of its compute actions
  std::vector<std::vector<ActionTiming>> timing;  // per rank and action (for trace timelines)
};

/// Runs the lists with the costs: a compute action occupies its rank, a send costs its rank nothing
/// and arrives transfer_seconds later, a receive waits for the arrival, an AllReduce starts when the
/// last member arrives. Throws partrain::Error as check_schedule does on a deadlock, and when the cost
/// vectors are not one entry per stage or a cost is negative.
/// With costs.shares_cores(), simulate_schedule_on_shared_cores.
TimelinePrediction simulate_schedule(const Plan& plan, const Schedule& schedule, const TimelineCosts& costs);

/// simulate_schedule's timeline for ranks that share their node's cores, as an event-driven
/// (processor-sharing) run: at each moment the k ranks of a node running a compute action or their
/// optimizer step each do min(1, c / k) seconds of their work per second, c =
/// costs.concurrent_ranks_per_node (0: as many as the node's ranks), as the operating system divides
/// cores among runnable processes; ranks waiting in a receive, an all-reduce or the step's barrier
/// give theirs away (their MPI waits sleep there: MpiCommunicator::set_sleeping_waits). Transfers and
/// all-reduces take their own seconds. With c at least the ranks per node it is simulate_schedule's
/// timeline. Throws as simulate_schedule.
TimelinePrediction simulate_schedule_on_shared_cores(const Plan& plan, const Schedule& schedule,
                                                     const TimelineCosts& costs);

}  // namespace partrain
