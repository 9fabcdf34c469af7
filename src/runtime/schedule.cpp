#include "runtime/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace partrain {

// ---------------- actions ----------------

const char* action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "Forward";
    case ActionKind::Backward: return "Backward";
    case ActionKind::Recompute: return "Recompute";
    case ActionKind::SendActivation: return "SendActivation";
    case ActionKind::ReceiveActivation: return "ReceiveActivation";
    case ActionKind::SendGradient: return "SendGradient";
    case ActionKind::ReceiveGradient: return "ReceiveGradient";
    case ActionKind::AllReduce: return "AllReduce";
    case ActionKind::Step: return "Step";
  }
  return "?";
}

Action Action::forward(int microbatch, std::int64_t begin, std::int64_t end, bool recomputed) {
  Action action;
  action.kind = ActionKind::Forward;
  action.microbatch = microbatch;
  action.sample_begin = begin;
  action.sample_end = end;
  action.recomputed = recomputed;
  return action;
}

Action Action::backward(int microbatch, std::int64_t begin, std::int64_t end) {
  Action action = forward(microbatch, begin, end, false);
  action.kind = ActionKind::Backward;
  return action;
}

Action Action::recompute(int microbatch, std::int64_t begin, std::int64_t end) {
  Action action = forward(microbatch, begin, end, false);
  action.kind = ActionKind::Recompute;
  return action;
}

Action Action::transfer(ActionKind kind, int microbatch, int peer, std::int64_t begin, std::int64_t end) {
  Action action = forward(microbatch, begin, end, false);
  action.kind = kind;
  action.peer = peer;
  PARTRAIN_CHECK(action.is_send() || action.is_receive(),
                 "Action::transfer: " << action_kind_name(kind) << " is not a send or receive");
  return action;
}

Action Action::all_reduce(std::vector<int> group) {
  Action action;
  action.kind = ActionKind::AllReduce;
  action.group = std::move(group);
  return action;
}

Action Action::step() { return Action{}; }

bool Action::is_compute() const {
  return kind == ActionKind::Forward || kind == ActionKind::Backward || kind == ActionKind::Recompute;
}
bool Action::is_send() const { return kind == ActionKind::SendActivation || kind == ActionKind::SendGradient; }
bool Action::is_receive() const {
  return kind == ActionKind::ReceiveActivation || kind == ActionKind::ReceiveGradient;
}

std::string Action::to_string() const {
  std::ostringstream out;
  out << action_kind_name(kind);
  if (kind == ActionKind::Step) return out.str();
  if (kind == ActionKind::AllReduce) {
    out << "(ranks ";
    for (std::size_t k = 0; k < group.size(); ++k) out << (k ? "," : "") << group[k];
    out << ")";
    return out.str();
  }
  out << "(mb " << microbatch;
  if (is_send()) out << ", to " << peer;
  if (is_receive()) out << ", from " << peer;
  out << ", samples [" << sample_begin << "," << sample_end << ")";
  if (kind == ActionKind::Forward && recomputed) out << ", recomputed";
  out << ")";
  return out.str();
}

// ---------------- generation ----------------

namespace {

void check_plan_shape(const Plan& plan) {
  PARTRAIN_CHECK(!plan.stages.empty(), "schedule: the plan has no stages");
  for (std::size_t s = 0; s < plan.stages.size(); ++s)
    PARTRAIN_CHECK(plan.stages[s].replicas > 0,
                   "schedule: stage " << s << " has " << plan.stages[s].replicas << " replicas");
  PARTRAIN_CHECK(plan.pipeline_copies > 0, "schedule: " << plan.pipeline_copies << " pipeline copies");
  PARTRAIN_CHECK(plan.microbatches > 0, "schedule: " << plan.microbatches << " microbatches");
  PARTRAIN_CHECK(plan.world_size == plan.pipeline_copies * plan.devices_per_copy(),
                 "schedule: world size " << plan.world_size << " is not " << plan.pipeline_copies
                                         << " pipeline copies x " << plan.devices_per_copy() << " devices");
  for (std::size_t s = 0; s < plan.stages.size(); ++s)
    PARTRAIN_CHECK(plan.microbatch_size() >= plan.stages[s].replicas,
                   "schedule: a microbatch of " << plan.microbatch_size() << " samples cannot feed the "
                                                << plan.stages[s].replicas << " replicas of stage " << s);
}

/// A rank of a neighbouring stage and the samples exchanged with it.
struct Link {
  int rank;
  std::int64_t begin, end;
};

/// The replicas of `other_stage` (same copy) whose samples intersect [begin, end), with the
/// intersections, in replica order.
std::vector<Link> links_to(const Plan& plan, int copy, int other_stage, std::int64_t begin, std::int64_t end) {
  std::vector<Link> links;
  if (other_stage < 0 || other_stage >= static_cast<int>(plan.stages.size())) return links;
  for (int q = 0; q < plan.stages[other_stage].replicas; ++q) {
    auto [b, e] = plan.replica_samples(other_stage, q);
    const std::int64_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo < hi) links.push_back({plan.rank_of({copy, other_stage, q}), lo, hi});
  }
  return links;
}

/// The stage's data-parallel group: its replicas in every pipeline copy, ascending.
std::vector<int> stage_group(const Plan& plan, int stage) {
  std::vector<int> group;
  for (int c = 0; c < plan.pipeline_copies; ++c)
    for (int r = 0; r < plan.stages[stage].replicas; ++r) group.push_back(plan.rank_of({c, stage, r}));
  return group;
}

std::vector<Action> generate_rank(const Plan& plan, int rank) {
  const Placement place = plan.placement_of(rank);
  const int S = static_cast<int>(plan.stages.size());
  const int M = plan.microbatches;
  const int s = place.stage;
  const auto [begin, end] = plan.replica_samples(s, place.replica);
  const std::vector<Link> previous = links_to(plan, place.copy, s - 1, begin, end);
  const std::vector<Link> next = links_to(plan, place.copy, s + 1, begin, end);
  const ScheduleKind kind = plan.schedule;
  const bool scp = kind == ScheduleKind::ShiftedCriticalPath;
  const bool recompute =
      plan.stages[s].recompute != RecomputePolicy::None && !(scp && s == S - 1);

  std::vector<Action> list;
  auto emit_forward = [&](int mb) {
    for (const Link& link : previous)
      list.push_back(Action::transfer(ActionKind::ReceiveActivation, mb, link.rank, link.begin, link.end));
    list.push_back(Action::forward(mb, begin, end, recompute));
    for (const Link& link : next)
      list.push_back(Action::transfer(ActionKind::SendActivation, mb, link.rank, link.begin, link.end));
  };
  auto emit_backward = [&](int mb) {
    if (recompute && scp) list.push_back(Action::recompute(mb, begin, end));
    for (const Link& link : next)
      list.push_back(Action::transfer(ActionKind::ReceiveGradient, mb, link.rank, link.begin, link.end));
    if (recompute && !scp) list.push_back(Action::recompute(mb, begin, end));
    list.push_back(Action::backward(mb, begin, end));
    for (const Link& link : previous)
      list.push_back(Action::transfer(ActionKind::SendGradient, mb, link.rank, link.begin, link.end));
  };

  if (kind == ScheduleKind::GPipe) {
    for (int mb = 0; mb < M; ++mb) emit_forward(mb);
    for (int mb = M - 1; mb >= 0; --mb) emit_backward(mb);
  } else {
    const int warmup = std::min(S - s - 1, M);
    for (int mb = 0; mb < warmup; ++mb) emit_forward(mb);
    for (int k = 0; k < M - warmup; ++k) {
      emit_forward(warmup + k);
      emit_backward(k);
    }
    for (int mb = M - warmup; mb < M; ++mb) emit_backward(mb);
  }

  std::vector<int> group = stage_group(plan, s);
  if (group.size() > 1) list.push_back(Action::all_reduce(std::move(group)));
  list.push_back(Action::step());
  return list;
}

}  // namespace

Schedule generate_schedule(const Plan& plan) {
  check_plan_shape(plan);
  Schedule schedule(plan.world_size);
  for (int rank = 0; rank < plan.world_size; ++rank) schedule[rank] = generate_rank(plan, rank);
  return schedule;
}

int peak_in_flight(const std::vector<Action>& actions) {
  int in_flight = 0, peak = 0;
  for (const Action& action : actions) {
    if (action.kind == ActionKind::Forward) peak = std::max(peak, ++in_flight);
    if (action.kind == ActionKind::Backward) --in_flight;
  }
  return peak;
}

// ---------------- running the lists together ----------------

namespace {

std::string where(const Plan& plan, int rank) {
  std::ostringstream out;
  out << "rank " << rank;
  if (rank >= 0 && rank < plan.world_size) {
    const Placement place = plan.placement_of(rank);
    out << " (copy " << place.copy << ", stage " << place.stage << ", replica " << place.replica << ")";
  }
  return out.str();
}

std::string at(const Plan& plan, const Schedule& schedule, int rank, std::size_t index) {
  std::ostringstream out;
  out << where(plan, rank) << " action #" << index << " " << schedule[rank][index].to_string();
  return out.str();
}

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
  // (from, to, gradient?, microbatch) → FIFO of posted sends.
  std::map<std::tuple<int, int, bool, int>, std::deque<Message>> mailbox;
  std::vector<std::size_t> pc;
  std::vector<double> clock;
  std::vector<std::vector<ActionTiming>> timing;

  Runner(const Plan& p, const Schedule& s, const TimelineCosts* c) : plan(p), schedule(s), costs(c) {
    const std::size_t ranks = schedule.size();
    pc.assign(ranks, 0);
    clock.assign(ranks, 0.0);
    timing.resize(ranks);
    for (std::size_t r = 0; r < ranks; ++r) timing[r].resize(schedule[r].size());
  }

  int stage_of(int rank) const { return plan.placement_of(rank).stage; }

  double compute_cost(int rank, const Action& action) const {
    if (!costs) return 0;
    const int s = stage_of(rank);
    switch (action.kind) {
      case ActionKind::Forward: return costs->forward_seconds[s];
      case ActionKind::Backward: return costs->backward_seconds[s];
      case ActionKind::Recompute: return costs->recompute_seconds[s];
      case ActionKind::Step: return costs->step_seconds;
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
      if (action.kind == ActionKind::AllReduce) break;
      if (action.is_receive()) {
        const bool gradient = action.kind == ActionKind::ReceiveGradient;
        auto it = mailbox.find({action.peer, rank, gradient, action.microbatch});
        if (it == mailbox.end() || it->second.empty()) break;
        const Message message = it->second.front();
        it->second.pop_front();
        PARTRAIN_CHECK(message.begin == action.sample_begin && message.end == action.sample_end,
                       "schedule: " << at(plan, schedule, rank, index) << " receives samples [" << message.begin
                                    << "," << message.end << ") from " << at(plan, schedule, action.peer,
                                                                              message.send_index));
        timing[rank][index] = {now, std::max(now, message.arrival)};
        now = std::max(now, message.arrival);
      } else if (action.is_send()) {
        PARTRAIN_CHECK(action.peer >= 0 && action.peer < static_cast<int>(schedule.size()) && action.peer != rank,
                       "schedule: " << at(plan, schedule, rank, index) << " has no valid peer rank");
        const bool gradient = action.kind == ActionKind::SendGradient;
        double transfer = 0;
        if (costs && costs->transfer_seconds)
          transfer = costs->transfer_seconds(action.kind, rank, action.peer, action.sample_end - action.sample_begin);
        PARTRAIN_CHECK(transfer >= 0, "simulate_schedule: negative transfer time for " << at(plan, schedule, rank, index));
        mailbox[{rank, action.peer, gradient, action.microbatch}].push_back(
            {action.sample_begin, action.sample_end, now + transfer, index});
        timing[rank][index] = {now, now};
      } else {
        const double cost = compute_cost(rank, action);
        timing[rank][index] = {now, now + cost};
        now += cost;
      }
      ++pc[rank];
      moved = true;
    }
    return moved;
  }

  /// Completes every all-reduce whose members all reached it. Returns true when one completed.
  bool collectives() {
    bool moved = false;
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
      double cost = 0;
      if (costs && costs->all_reduce_seconds) cost = costs->all_reduce_seconds(stage_of(rank));
      PARTRAIN_CHECK(cost >= 0, "simulate_schedule: negative all-reduce time for stage " << stage_of(rank));
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

/// Per-rank checks that need no other rank: completeness and order of every microbatch's actions,
/// peers, sample ranges, groups, Step last.
void check_rank(const Plan& plan, const Schedule& schedule, int rank) {
  const std::vector<Action>& list = schedule[rank];
  const Placement place = plan.placement_of(rank);
  const int s = place.stage;
  const int M = plan.microbatches;
  const auto [begin, end] = plan.replica_samples(s, place.replica);
  const std::vector<Link> previous = links_to(plan, place.copy, s - 1, begin, end);
  const std::vector<Link> next = links_to(plan, place.copy, s + 1, begin, end);
  const std::vector<int> group = stage_group(plan, s);

  struct State {
    int forwards = 0, backwards = 0, recomputes = 0;
    bool recomputed = false;
    std::vector<int> sent_activation, received_activation, sent_gradient, received_gradient;  // peers
  };
  std::vector<State> states(M);
  int steps = 0, all_reduces = 0;

  auto expect_link = [&](std::size_t index, const std::vector<Link>& links, std::vector<int>& seen) {
    const Action& action = list[index];
    auto link = std::find_if(links.begin(), links.end(), [&](const Link& l) { return l.rank == action.peer; });
    PARTRAIN_CHECK(link != links.end(), "schedule: " << at(plan, schedule, rank, index)
                                                     << ": the peer is not a neighbouring-stage replica of the "
                                                        "same pipeline copy that shares samples with this rank");
    PARTRAIN_CHECK(link->begin == action.sample_begin && link->end == action.sample_end,
                   "schedule: " << at(plan, schedule, rank, index) << ": the samples shared with rank " << link->rank
                                << " are [" << link->begin << "," << link->end << ")");
    PARTRAIN_CHECK(std::find(seen.begin(), seen.end(), action.peer) == seen.end(),
                   "schedule: " << at(plan, schedule, rank, index) << " is repeated");
    seen.push_back(action.peer);
  };

  for (std::size_t index = 0; index < list.size(); ++index) {
    const Action& action = list[index];
    PARTRAIN_CHECK(steps == 0, "schedule: " << at(plan, schedule, rank, index) << " comes after Step");
    if (action.kind == ActionKind::Step) {
      ++steps;
      continue;
    }
    if (action.kind == ActionKind::AllReduce) {
      PARTRAIN_CHECK(action.group == group, "schedule: " << at(plan, schedule, rank, index)
                                                         << ": the stage's data-parallel group has "
                                                         << group.size() << " ranks from " << group.front());
      for (int mb = 0; mb < M; ++mb)
        PARTRAIN_CHECK(states[mb].backwards == 1, "schedule: " << at(plan, schedule, rank, index)
                                                               << " comes before Backward(mb " << mb << ")");
      ++all_reduces;
      continue;
    }
    PARTRAIN_CHECK(action.microbatch >= 0 && action.microbatch < M,
                   "schedule: " << at(plan, schedule, rank, index) << ": microbatch outside [0, " << M << ")");
    State& state = states[action.microbatch];
    if (action.is_compute())
      PARTRAIN_CHECK(action.sample_begin == begin && action.sample_end == end,
                     "schedule: " << at(plan, schedule, rank, index) << ": the rank's samples are [" << begin << ","
                                  << end << ")");
    switch (action.kind) {
      case ActionKind::Forward:
        PARTRAIN_CHECK(state.forwards == 0, "schedule: " << at(plan, schedule, rank, index) << " is repeated");
        PARTRAIN_CHECK(state.received_activation.size() == previous.size(),
                       "schedule: " << at(plan, schedule, rank, index) << " comes before receiving all its inputs ("
                                    << state.received_activation.size() << " of " << previous.size() << ")");
        ++state.forwards;
        state.recomputed = action.recomputed;
        break;
      case ActionKind::Recompute:
        PARTRAIN_CHECK(state.forwards == 1 && state.recomputed,
                       "schedule: " << at(plan, schedule, rank, index) << " without a recomputed Forward before it");
        PARTRAIN_CHECK(state.backwards == 0 && state.recomputes == 0,
                       "schedule: " << at(plan, schedule, rank, index) << " is repeated or after Backward");
        ++state.recomputes;
        break;
      case ActionKind::Backward:
        PARTRAIN_CHECK(state.forwards == 1, "schedule: " << at(plan, schedule, rank, index) << " before its Forward");
        PARTRAIN_CHECK(state.backwards == 0, "schedule: " << at(plan, schedule, rank, index) << " is repeated");
        PARTRAIN_CHECK(!state.recomputed || state.recomputes == 1,
                       "schedule: " << at(plan, schedule, rank, index) << " of a recomputed Forward has no Recompute");
        PARTRAIN_CHECK(state.received_gradient.size() == next.size(),
                       "schedule: " << at(plan, schedule, rank, index) << " comes before receiving all its gradients ("
                                    << state.received_gradient.size() << " of " << next.size() << ")");
        ++state.backwards;
        break;
      case ActionKind::ReceiveActivation:
        PARTRAIN_CHECK(state.forwards == 0, "schedule: " << at(plan, schedule, rank, index) << " after its Forward");
        expect_link(index, previous, state.received_activation);
        break;
      case ActionKind::SendActivation:
        PARTRAIN_CHECK(state.forwards == 1, "schedule: " << at(plan, schedule, rank, index) << " before its Forward");
        expect_link(index, next, state.sent_activation);
        break;
      case ActionKind::ReceiveGradient:
        PARTRAIN_CHECK(state.backwards == 0, "schedule: " << at(plan, schedule, rank, index) << " after its Backward");
        expect_link(index, next, state.received_gradient);
        break;
      case ActionKind::SendGradient:
        PARTRAIN_CHECK(state.backwards == 1, "schedule: " << at(plan, schedule, rank, index) << " before its Backward");
        expect_link(index, previous, state.sent_gradient);
        break;
      default: break;
    }
  }
  PARTRAIN_CHECK(steps == 1 && !list.empty() && list.back().kind == ActionKind::Step,
                 "schedule: the list of " << where(plan, rank) << " does not end with exactly one Step");
  PARTRAIN_CHECK(all_reduces <= 1, "schedule: " << where(plan, rank) << " has " << all_reduces << " AllReduce actions");
  PARTRAIN_CHECK(group.size() == 1 || all_reduces == 1,
                 "schedule: " << where(plan, rank) << " never all-reduces its gradients over its "
                              << group.size() << "-rank data-parallel group");
  for (int mb = 0; mb < M; ++mb) {
    const State& state = states[mb];
    PARTRAIN_CHECK(state.forwards == 1 && state.backwards == 1,
                   "schedule: " << where(plan, rank) << " runs microbatch " << mb << " forward " << state.forwards
                                << " and backward " << state.backwards << " times (expected once each)");
    PARTRAIN_CHECK(state.sent_activation.size() == next.size() && state.sent_gradient.size() == previous.size(),
                   "schedule: " << where(plan, rank) << " does not send every activation and gradient of microbatch "
                                << mb << " (" << state.sent_activation.size() << " of " << next.size()
                                << " activations, " << state.sent_gradient.size() << " of " << previous.size()
                                << " gradients)");
  }
}

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
}

}  // namespace

void check_schedule(const Plan& plan, const Schedule& schedule) {
  check_plan_shape(plan);
  PARTRAIN_CHECK(static_cast<int>(schedule.size()) == plan.world_size,
                 "schedule: " << schedule.size() << " lists for a plan of " << plan.world_size << " ranks");
  for (int rank = 0; rank < plan.world_size; ++rank) check_rank(plan, schedule, rank);
  Runner runner(plan, schedule, nullptr);
  runner.run();
}

TimelineCosts TimelineCosts::from_plan(const Plan& plan) {
  TimelineCosts costs;
  for (const PlanStage& stage : plan.stages) {
    const bool recomputes = stage.recompute != RecomputePolicy::None;
    costs.forward_seconds.push_back(stage.forward_seconds);
    costs.recompute_seconds.push_back(recomputes ? stage.forward_seconds : 0.0);
    costs.backward_seconds.push_back(
        recomputes ? std::max(0.0, stage.backward_seconds - stage.forward_seconds) : stage.backward_seconds);
  }
  return costs;
}

TimelinePrediction simulate_schedule(const Plan& plan, const Schedule& schedule, const TimelineCosts& costs) {
  check_plan_shape(plan);
  check_costs(plan, costs);
  Runner runner(plan, schedule, &costs);
  runner.run();

  TimelinePrediction prediction;
  const std::size_t ranks = schedule.size();
  prediction.rank_compute_seconds.assign(ranks, 0.0);
  double busy = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    prediction.step_seconds = std::max(prediction.step_seconds, runner.clock[r]);
    for (std::size_t k = 0; k < schedule[r].size(); ++k) {
      if (!schedule[r][k].is_compute()) continue;
      const ActionTiming& t = runner.timing[r][k];
      prediction.rank_compute_seconds[r] += t.end - t.start;
      prediction.pipeline_seconds = std::max(prediction.pipeline_seconds, t.end);
    }
    busy += prediction.rank_compute_seconds[r];
  }
  if (prediction.pipeline_seconds > 0)
    prediction.bubble_fraction = 1.0 - busy / (static_cast<double>(ranks) * prediction.pipeline_seconds);
  prediction.timing = std::move(runner.timing);
  return prediction;
}

}  // namespace partrain
