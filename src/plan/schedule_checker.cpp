#include "plan/schedule_checker.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "plan/schedule_runner.h"
#include "plan/schedule_topology.h"

namespace partrain {
namespace {

/// Per-rank checks that need no other rank: completeness and order of every microbatch's actions,
/// peers, sample ranges, groups, Step last.
void check_rank(const Plan& plan, const Schedule& schedule, int rank) {
  const std::vector<Action>& list = schedule[rank];
  const Placement place = plan.placement_of(rank);
  const int s = place.stage;
  const int M = plan.microbatches;
  const int v = schedule_has_chunks(plan.schedule) ? plan.virtual_stages : 1;
  const auto [begin, end] = plan.replica_samples(s, place.replica);
  // Per local model chunk k (model chunk k·S + s; the stage itself without interleaving).
  std::vector<std::vector<Link>> previous_of(v), next_of(v);
  for (int k = 0; k < v; ++k) {
    const int chunk = global_chunk(plan, rank, k);
    previous_of[k] = links_to(plan, place, chunk - 1, begin, end);
    next_of[k] = links_to(plan, place, chunk + 1, begin, end);
  }
  const std::vector<int> group = stage_group(plan, s, place.tensor_rank);

  struct State {
    int forwards = 0, backwards = 0, recomputes = 0;
    bool split = false;  // its backward is a BackwardInput and a BackwardWeight
    int weights = 0;     // BackwardWeight actions run
    bool activations_recomputed = false;  // its Forward left the activations to a Recompute
    std::vector<int> sent_activation, received_activation, sent_gradient, received_gradient;  // peers
  };
  std::vector<State> states(static_cast<std::size_t>(M) * v);  // [chunk · M + microbatch]
  int steps = 0, all_reduces = 0;

  auto expect_link = [&](std::size_t index, const std::vector<Link>& links, std::vector<int>& seen) {
    const Action& action = list[index];
    auto link = std::find_if(links.begin(), links.end(), [&](const Link& l) { return l.rank == action.peer; });
    PARTRAIN_CHECK(link != links.end(), "schedule: " << at(plan, schedule, rank, index)
                                                     << ": the peer is not a neighbouring-stage replica of the "
                                                        "same pipeline replica that shares samples with this rank");
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
      for (int mb = 0; mb < M * v; ++mb)
        PARTRAIN_CHECK(states[mb].backwards == 1 && states[mb].weights == (states[mb].split ? 1 : 0), "schedule: " << at(plan, schedule, rank, index)
                                                               << " comes before Backward(mb " << mb % M
                                                               << (v > 1 ? ", chunk " + std::to_string(mb / M) : "") << ")");
      ++all_reduces;
      continue;
    }
    PARTRAIN_CHECK(action.microbatch >= 0 && action.microbatch < M,
                   "schedule: " << at(plan, schedule, rank, index) << ": microbatch outside [0, " << M << ")");
    PARTRAIN_CHECK(action.chunk >= 0 && action.chunk < v,
                   "schedule: " << at(plan, schedule, rank, index) << ": chunk outside [0, " << v << ")");
    State& state = states[static_cast<std::size_t>(action.chunk) * M + action.microbatch];
    const std::vector<Link>& previous = previous_of[action.chunk];
    const std::vector<Link>& next = next_of[action.chunk];
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
        state.activations_recomputed = action.activations_recomputed;
        break;
      case ActionKind::Recompute:
        PARTRAIN_CHECK(state.forwards == 1 && state.activations_recomputed,
                       "schedule: " << at(plan, schedule, rank, index) << " without a recomputed Forward before it");
        PARTRAIN_CHECK(state.backwards == 0 && state.recomputes == 0,
                       "schedule: " << at(plan, schedule, rank, index) << " is repeated or after Backward");
        ++state.recomputes;
        break;
      case ActionKind::BackwardWeight:
        PARTRAIN_CHECK(state.split && state.backwards == 1,
                       "schedule: " << at(plan, schedule, rank, index) << " before its BackwardInput");
        PARTRAIN_CHECK(state.weights == 0, "schedule: " << at(plan, schedule, rank, index) << " is repeated");
        ++state.weights;
        break;
      case ActionKind::Backward:
      case ActionKind::BackwardInput:
        PARTRAIN_CHECK(state.forwards == 1, "schedule: " << at(plan, schedule, rank, index) << " before its Forward");
        PARTRAIN_CHECK(state.backwards == 0, "schedule: " << at(plan, schedule, rank, index) << " is repeated");
        PARTRAIN_CHECK(!state.activations_recomputed || state.recomputes == 1,
                       "schedule: " << at(plan, schedule, rank, index) << " of a recomputed Forward has no Recompute");
        PARTRAIN_CHECK(state.received_gradient.size() == next.size(),
                       "schedule: " << at(plan, schedule, rank, index) << " comes before receiving all its gradients ("
                                    << state.received_gradient.size() << " of " << next.size() << ")");
        ++state.backwards;
        state.split = action.kind == ActionKind::BackwardInput;
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
  for (int index = 0; index < M * v; ++index) {
    const int mb = index % M;
    const State& state = states[index];
    const std::vector<Link>& previous = previous_of[index / M];
    const std::vector<Link>& next = next_of[index / M];
    PARTRAIN_CHECK(state.forwards == 1 && state.backwards == 1,
                   "schedule: " << where(plan, rank) << " runs microbatch " << mb << " forward " << state.forwards
                                << " and backward " << state.backwards << " times (expected once each)");
    PARTRAIN_CHECK(!state.split || state.weights == 1,
                   "schedule: " << where(plan, rank) << " never runs BackwardWeight of microbatch " << mb);
    PARTRAIN_CHECK(state.sent_activation.size() == next.size() && state.sent_gradient.size() == previous.size(),
                   "schedule: " << where(plan, rank) << " does not send every activation and gradient of microbatch "
                                << mb << " (" << state.sent_activation.size() << " of " << next.size()
                                << " activations, " << state.sent_gradient.size() << " of " << previous.size()
                                << " gradients)");
  }
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

}  // namespace partrain
