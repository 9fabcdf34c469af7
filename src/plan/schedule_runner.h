#pragma once
// The engine the checker and the simulator share: all ranks' action lists run in lockstep with
// buffered sends, blocking receives and collective all-reduces; with costs, each action's timing.
#include <algorithm>
#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include "plan/schedule_simulator.h"
#include "plan/schedule_topology.h"

namespace partrain {

/// "rank 3 (pipeline replica 0, stage 1, replica 1)".
std::string where(const Plan& plan, int rank);
/// "rank 3 (pipeline replica 0, stage 1, replica 1) action #4 Forward(mb 0, ...)".
std::string at(const Plan& plan, const Schedule& schedule, int rank, std::size_t index);

/// Runs the lists with buffered sends, blocking receives and collective all-reduces; with costs it
/// also computes each action's timing.
struct Runner {
  const Plan& plan;
  const Schedule& schedule;
  const TimelineCosts* costs;  // null: all costs 0

  struct Message {
    std::int64_t begin, end;
    double arrival;
    std::size_t send_index;
  };
  // (from, to, gradient?, microbatch, receiving model chunk) → FIFO of posted sends.
  std::map<std::tuple<int, int, bool, int, int>, std::deque<Message>> mailbox;
  std::vector<std::size_t> pc;
  std::vector<double> clock;
  std::vector<std::vector<ActionTiming>> timing;
  /// Per rank and receive action: the index of the send it took in its peer's list (the
  /// shared-core simulator replays these pairings).
  std::vector<std::vector<std::size_t>> matched_send;

  Runner(const Plan& p, const Schedule& s, const TimelineCosts* c) : plan(p), schedule(s), costs(c) {
    const std::size_t ranks = schedule.size();
    pc.assign(ranks, 0);
    clock.assign(ranks, 0.0);
    timing.resize(ranks);
    matched_send.resize(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
      timing[r].resize(schedule[r].size());
      matched_send[r].assign(schedule[r].size(), 0);
    }
  }

  int stage_of(int rank) const { return plan.placement_of(rank).stage; }

  double weight_seconds(int stage) const {
    return costs->weight_gradient_seconds.empty() ? 0.0 : costs->weight_gradient_seconds[stage];
  }

  double compute_cost(int rank, std::size_t index, const Action& action) const {
    if (!costs) return 0;
    if (costs->action_seconds) return costs->action_seconds(rank, index);
    const int s = global_chunk(plan, rank, action.chunk);  // the stage itself without interleaving
    switch (action.kind) {
      case ActionKind::Forward: return costs->forward_seconds[s];
      case ActionKind::Backward: return costs->backward_seconds[s];
      case ActionKind::BackwardInput: return costs->backward_seconds[s] - weight_seconds(s);
      case ActionKind::BackwardWeight: return weight_seconds(s);
      case ActionKind::Recompute: return costs->recompute_seconds[s];
      case ActionKind::Step: {
        if (costs->stage_step_seconds.empty()) return costs->step_seconds;
        double seconds = 0;  // the optimizer steps every model chunk the rank holds
        for (int chunk : plan.chunks_of_stage(stage_of(rank))) seconds += costs->stage_step_seconds.at(chunk);
        return seconds;
      }
      default: return 0;
    }
  }

  /// Advances one rank as far as it can go without a collective. Returns true when it moved.
  bool advance(int rank) {
    const std::vector<Action>& list = schedule[rank];
    bool moved = false;
    while (pc[rank] < list.size()) {
      const std::size_t index = pc[rank];
      const Action& action = list[index];
      double& now = clock[rank];
      if (action.kind == ActionKind::AllReduce || (action.kind == ActionKind::Step && synchronized_step())) break;
      if (action.is_receive()) {
        const bool gradient = action.kind == ActionKind::ReceiveGradient;
        auto it = mailbox.find({action.peer, rank, gradient, action.microbatch, receiver_chunk(plan, rank, action)});
        if (it == mailbox.end() || it->second.empty()) break;
        const Message message = it->second.front();
        it->second.pop_front();
        PARTRAIN_CHECK(message.begin == action.sample_begin && message.end == action.sample_end,
                       "schedule: " << at(plan, schedule, rank, index) << " receives samples [" << message.begin
                                    << "," << message.end << ") from " << at(plan, schedule, action.peer,
                                                                              message.send_index));
        timing[rank][index] = {now, std::max(now, message.arrival)};
        matched_send[rank][index] = message.send_index;
        now = std::max(now, message.arrival);
      } else if (action.is_send()) {
        // zb_v's chunks S − 1 and S share a rank: that message goes from the rank to itself.
        PARTRAIN_CHECK(action.peer >= 0 && action.peer < static_cast<int>(schedule.size()) &&
                           (action.peer != rank || plan.schedule == ScheduleKind::ZeroBubbleV),
                       "schedule: " << at(plan, schedule, rank, index) << " has no valid peer rank");
        const bool gradient = action.kind == ActionKind::SendGradient;
        const double transfer = transfer_cost(rank, index);
        mailbox[{rank, action.peer, gradient, action.microbatch, receiver_chunk(plan, rank, action)}].push_back(
            {action.sample_begin, action.sample_end, now + transfer, index});
        timing[rank][index] = {now, now};
      } else {
        const double cost = compute_cost(rank, index, action);
        timing[rank][index] = {now, now + cost};
        now += cost;
      }
      ++pc[rank];
      moved = true;
    }
    return moved;
  }

  bool synchronized_step() const { return costs && costs->synchronized_step; }

  double tied_seconds(int rank) const {
    double seconds = 0;  // one coalesced all-reduce of every model chunk's shared parameters
    if (costs && !costs->tied_all_reduce_seconds.empty())
      for (int chunk : plan.chunks_of_stage(stage_of(rank))) seconds += costs->tied_all_reduce_seconds.at(chunk);
    return seconds;
  }

  /// When the step's barrier passes for the ranks `waiting` at their Step, each arrived at
  /// `arrived[rank]`: the tied all-reduce starts when its last rank arrives and lasts its longest
  /// member, and the barrier passes when it has ended and every other rank arrived.
  double barrier_seconds(const std::vector<int>& waiting, const std::vector<double>& arrived) const {
    double tied_start = 0, tied_cost = 0, barrier = 0;
    for (int rank : waiting) {
      const double tied = tied_seconds(rank);
      if (tied > 0) {
        tied_start = std::max(tied_start, arrived[rank]);
        tied_cost = std::max(tied_cost, tied);
      } else {
        barrier = std::max(barrier, arrived[rank]);
      }
    }
    return tied_cost > 0 ? std::max(barrier, tied_start + tied_cost) : barrier;
  }

  /// With a synchronized step, once every rank still running waits at its Step: the tied
  /// all-reduce over the ranks sharing parameters, the world barrier, then each rank's optimizer
  /// (runtime/executor.cpp, optimizer_step). Returns true when the step ran.
  bool step_barrier() {
    if (!synchronized_step()) return false;
    std::vector<int> waiting;
    for (int rank = 0; rank < static_cast<int>(schedule.size()); ++rank) {
      if (pc[rank] >= schedule[rank].size()) continue;
      if (schedule[rank][pc[rank]].kind != ActionKind::Step) return false;
      waiting.push_back(rank);
    }
    if (waiting.empty()) return false;
    const double barrier = barrier_seconds(waiting, clock);
    for (int rank : waiting) {
      const std::size_t index = pc[rank];
      const double end = barrier + compute_cost(rank, index, schedule[rank][index]);
      timing[rank][index] = {clock[rank], end};
      clock[rank] = end;
      ++pc[rank];
    }
    return true;
  }

  /// Seconds of `rank`'s AllReduce: one reduction of every model chunk its stage holds.
  double all_reduce_cost(int rank) const {
    double cost = 0;
    if (costs && costs->all_reduce_seconds)
      for (int chunk : plan.chunks_of_stage(stage_of(rank))) cost += costs->all_reduce_seconds(chunk);
    PARTRAIN_CHECK(cost >= 0, "simulate_schedule: negative all-reduce time for stage " << stage_of(rank));
    return cost;
  }

  /// Seconds from posting send action `index` of `rank` to its arrival.
  double transfer_cost(int rank, std::size_t index) const {
    const Action& action = schedule[rank][index];
    double transfer = 0;
    if (costs && costs->transfer_seconds)
      transfer = costs->transfer_seconds(action.kind, rank, action.peer, action.sample_end - action.sample_begin);
    PARTRAIN_CHECK(transfer >= 0, "simulate_schedule: negative transfer time for " << at(plan, schedule, rank, index));
    return transfer;
  }

  /// Completes every all-reduce whose members all reached it. Returns true when one completed.
  bool collectives() {
    bool moved = step_barrier();
    for (int rank = 0; rank < static_cast<int>(schedule.size()); ++rank) {
      if (pc[rank] >= schedule[rank].size() || schedule[rank][pc[rank]].kind != ActionKind::AllReduce) continue;
      const Action& action = schedule[rank][pc[rank]];
      PARTRAIN_CHECK(std::find(action.group.begin(), action.group.end(), rank) != action.group.end(),
                     "schedule: " << at(plan, schedule, rank, pc[rank]) << " is not in its own group");
      bool ready = true;
      for (int member : action.group) {
        PARTRAIN_CHECK(member >= 0 && member < static_cast<int>(schedule.size()),
                       "schedule: " << at(plan, schedule, rank, pc[rank]) << " names rank " << member);
        if (pc[member] >= schedule[member].size() || schedule[member][pc[member]].kind != ActionKind::AllReduce) {
          ready = false;
          break;
        }
        PARTRAIN_CHECK(schedule[member][pc[member]].group == action.group,
                       "schedule: " << at(plan, schedule, rank, pc[rank]) << " meets "
                                    << at(plan, schedule, member, pc[member]) << " with a different group");
      }
      if (!ready) continue;
      double start = 0;
      for (int member : action.group) start = std::max(start, clock[member]);
      const double cost = all_reduce_cost(rank);
      const std::vector<int> group = action.group;  // `action` refers into the list; copy before moving on
      for (int member : group) {
        timing[member][pc[member]] = {clock[member], start + cost};
        clock[member] = start + cost;
        ++pc[member];
      }
      moved = true;
    }
    return moved;
  }

  void run() {
    PARTRAIN_CHECK(static_cast<int>(schedule.size()) == plan.world_size,
                   "schedule: " << schedule.size() << " lists for a plan of " << plan.world_size << " ranks");
    bool moved = true;
    while (moved) {
      moved = false;
      for (int rank = 0; rank < static_cast<int>(schedule.size()); ++rank) moved = advance(rank) || moved;
      moved = collectives() || moved;
    }
    std::ostringstream stuck;
    int count = 0;
    for (int rank = 0; rank < static_cast<int>(schedule.size()); ++rank) {
      if (pc[rank] >= schedule[rank].size()) continue;
      stuck << (count++ ? "; " : "") << where(plan, rank) << " waits at action #" << pc[rank] << " "
            << schedule[rank][pc[rank]].to_string();
    }
    PARTRAIN_CHECK(count == 0, "schedule deadlocks (" << schedule_name(plan.schedule) << "): " << stuck.str());
    for (const auto& [key, queue] : mailbox) {
      if (queue.empty()) continue;
      const int from = std::get<0>(key);
      PARTRAIN_FAIL("schedule: " << at(plan, schedule, from, queue.front().send_index) << " is never received");
    }
  }
};

}  // namespace partrain
