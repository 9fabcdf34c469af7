#include "plan/shared_core_timeline.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace partrain {

SharedCoreTimeline::SharedCoreTimeline(const Runner& paired)
    : paired_(paired), plan_(paired.plan), schedule_(paired.schedule), costs_(*paired.costs) {
  const std::size_t ranks = schedule_.size();
  clock.assign(ranks, 0.0);
  timing.resize(ranks);
  pc_.assign(ranks, 0);
  state_.assign(ranks, State::Arrived);
  arrived_.assign(ranks, 0.0);
  work_.assign(ranks, 0.0);
  until_.assign(ranks, 0.0);
  arrival_.resize(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    timing[r].resize(schedule_[r].size());
    arrival_[r].assign(schedule_[r].size(), -1.0);
  }
}

void SharedCoreTimeline::finish_action(int rank, double end) {
  timing[rank][pc_[rank]] = {arrived_[rank], end};
  ++pc_[rank];
  arrived_[rank] = end;
  state_[rank] = State::Arrived;
}

// Moves `rank` through the actions it can take at now_ without time passing. Returns true when it moved.
bool SharedCoreTimeline::settle_rank(int rank) {
  bool moved = false;
  while (state_[rank] == State::Arrived || state_[rank] == State::Waiting) {
    const std::vector<Action>& list = schedule_[rank];
    if (pc_[rank] >= list.size()) {
      state_[rank] = State::Done;
      clock[rank] = arrived_[rank];
      return true;
    }
    const std::size_t index = pc_[rank];
    const Action& action = list[index];
    if (action.is_send()) {
      arrival_[rank][index] = now_ + paired_.transfer_cost(rank, index);
      finish_action(rank, now_);
    } else if (action.is_receive()) {
      const double arrival = arrival_[action.peer][paired_.matched_send[rank][index]];
      if (arrival < 0 || arrival > now_) {
        state_[rank] = State::Waiting;
        return moved;
      }
      finish_action(rank, std::max(arrived_[rank], arrival));
    } else if (action.kind == ActionKind::AllReduce ||
               (action.kind == ActionKind::Step && paired_.synchronized_step())) {
      if (state_[rank] == State::Waiting) return moved;
      state_[rank] = State::Waiting;  // the collective starts once every member waits (run)
    } else {
      work_[rank] = paired_.compute_cost(rank, index, action);
      if (work_[rank] > 0) {
        state_[rank] = State::Computing;
      } else {
        finish_action(rank, now_);
      }
    }
    moved = true;
  }
  return moved;
}

// Starts `rank`'s AllReduce when every member of its group waits at it (the Runner checked that the
// groups agree). Returns true when it started.
bool SharedCoreTimeline::start_all_reduce(int rank) {
  const Action& action = schedule_[rank][pc_[rank]];
  for (int member : action.group)
    if (state_[member] != State::Waiting || schedule_[member][pc_[member]].kind != ActionKind::AllReduce) return false;
  const double end = now_ + paired_.all_reduce_cost(rank);
  for (int member : action.group) {
    state_[member] = State::Until;
    until_[member] = end;
  }
  return true;
}

// The synchronized step (Runner::step_barrier): once every rank still running waits at its Step,
// the tied all-reduce from the last tied rank's arrival, the barrier, then each rank's optimizer.
bool SharedCoreTimeline::pass_step_barrier() {
  if (!paired_.synchronized_step()) return false;
  std::vector<int> waiting;
  for (int rank = 0; rank < static_cast<int>(schedule_.size()); ++rank) {
    if (state_[rank] == State::Done) continue;
    if (state_[rank] != State::Waiting || schedule_[rank][pc_[rank]].kind != ActionKind::Step) return false;
    waiting.push_back(rank);
  }
  if (waiting.empty()) return false;
  const double barrier = std::max(paired_.barrier_seconds(waiting, arrived_), now_);  // (the last arrived at now_)
  for (int rank : waiting) {
    state_[rank] = State::Until;
    until_[rank] = barrier;
  }
  return true;
}

void SharedCoreTimeline::run() {
  const int ranks = static_cast<int>(schedule_.size());
  const int per_node = costs_.ranks_per_node > 0 ? costs_.ranks_per_node : ranks;
  for (;;) {
    for (bool moved = true; moved;) {  // everything that happens at now_
      moved = false;
      for (int rank = 0; rank < ranks; ++rank) moved = settle_rank(rank) || moved;
      for (int rank = 0; rank < ranks; ++rank)
        if (state_[rank] == State::Waiting && schedule_[rank][pc_[rank]].kind == ActionKind::AllReduce)
          moved = start_all_reduce(rank) || moved;
      moved = pass_step_barrier() || moved;
    }
    std::vector<int> computing((ranks + per_node - 1) / per_node, 0);
    bool running = false;
    for (int rank = 0; rank < ranks; ++rank) {
      running = running || state_[rank] != State::Done;
      if (state_[rank] == State::Computing) ++computing[rank / per_node];
    }
    if (!running) return;
    // Seconds of work per second of each node's computing ranks: an even share of its cores.
    std::vector<double> rate(computing.size(), 1.0);
    if (costs_.ranks_per_node > 0 && costs_.concurrent_ranks_per_node > 0)
      for (std::size_t node = 0; node < rate.size(); ++node)
        if (computing[node] > 0) rate[node] = std::min(1.0, costs_.concurrent_ranks_per_node / computing[node]);
    // The next event: a rank's work done, an all-reduce or barrier over, a waited-for message landing.
    double next = std::numeric_limits<double>::infinity();
    std::vector<double> finish(ranks, next);
    for (int rank = 0; rank < ranks; ++rank) {
      if (state_[rank] == State::Computing) {
        finish[rank] = now_ + work_[rank] / rate[rank / per_node];
        next = std::min(next, finish[rank]);
      } else if (state_[rank] == State::Until) {
        next = std::min(next, until_[rank]);
      } else if (state_[rank] == State::Waiting && schedule_[rank][pc_[rank]].is_receive()) {
        const Action& action = schedule_[rank][pc_[rank]];
        const double arrival = arrival_[action.peer][paired_.matched_send[rank][pc_[rank]]];
        if (arrival > now_) next = std::min(next, arrival);
      }
    }
    // The Runner ran these lists to the end, so something is always pending.
    PARTRAIN_CHECK(std::isfinite(next), "simulate_schedule_on_shared_cores: no event pending (internal)");
    for (int rank = 0; rank < ranks; ++rank) {
      if (state_[rank] == State::Computing) {
        if (finish[rank] <= next) {
          finish_action(rank, next);
        } else {
          work_[rank] = std::max(0.0, work_[rank] - (next - now_) * rate[rank / per_node]);
        }
      } else if (state_[rank] == State::Until && until_[rank] <= next) {
        if (schedule_[rank][pc_[rank]].kind == ActionKind::Step) {  // the barrier passed: the optimizer's work
          work_[rank] = paired_.compute_cost(rank, pc_[rank], schedule_[rank][pc_[rank]]);
          state_[rank] = State::Computing;
          if (work_[rank] <= 0) finish_action(rank, next);
        } else {
          finish_action(rank, until_[rank]);
        }
      }
    }
    now_ = next;
  }
}

}  // namespace partrain
