#pragma once
// The event-driven engine of simulate_schedule_on_shared_cores: every rank's action list run in
// global time, the ranks of a node that compute at once sharing its cores (processor sharing).
#include <cstddef>
#include <vector>

#include "plan/schedule_runner.h"
#include "plan/schedule_simulator.h"

namespace partrain {

/// Runs the lists of `paired` (a Runner that already ran them with the same costs: the lists are
/// checked and each receive knows the send it takes) again in global time. A compute action or
/// Step has its cost in seconds of work; the k ranks of a node doing work at a moment each progress
/// at min(1, c / k) seconds of work per second (c = TimelineCosts::concurrent_ranks_per_node, nodes
/// of TimelineCosts::ranks_per_node consecutive ranks). Sends, receives, all-reduces and the step's
/// barrier follow the Runner's rules and take no share of the cores.
class SharedCoreTimeline {
 public:
  explicit SharedCoreTimeline(const Runner& paired);
  /// Runs to the end; fills clock (each rank's end) and timing (each action's start and end).
  void run();

  std::vector<double> clock;
  std::vector<std::vector<ActionTiming>> timing;

 private:
  enum class State {
    Arrived,    // at its next action, which has not started
    Waiting,    // in a receive, an all-reduce or the step's barrier
    Computing,  // doing work (a compute action, or its optimizer step after the barrier)
    Until,      // in an all-reduce, or the step's barrier, until `until_`
    Done,
  };

  bool settle_rank(int rank);
  bool start_all_reduce(int rank);
  bool pass_step_barrier();
  void finish_action(int rank, double end);

  const Runner& paired_;
  const Plan& plan_;
  const Schedule& schedule_;
  const TimelineCosts& costs_;
  double now_ = 0;
  std::vector<std::size_t> pc_;
  std::vector<State> state_;
  std::vector<double> arrived_;  // when the rank reached its current action (the action's start)
  std::vector<double> work_;     // seconds of work left (Computing)
  std::vector<double> until_;    // Until
  std::vector<std::vector<double>> arrival_;  // per send action: when its message arrives (−1: not posted)
};

}  // namespace partrain
