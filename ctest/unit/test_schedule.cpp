// Unit tests of the pipeline schedules (src/runtime/schedule): every generated list passes the
// checker over a grid of plans (stages, replicas, copies, microbatches, kinds, recomputation), the
// checker catches hand-made deadlocks and mismatched sample ranges, 1F1B keeps min(S−s, M)
// microbatches in flight, and the timeline simulator reproduces GPipe's bubble (S−1)/(M+S−1).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include "plan/schedule_checker.h"
#include "plan/schedule_simulator.h"
#include "support/errors.h"
#include <nlohmann/json.hpp>

namespace {

using partrain::Action;
using partrain::ActionKind;
using partrain::Plan;
using partrain::RecomputePolicy;
using partrain::Schedule;
using partrain::ScheduleKind;

/// A plan without a graph: `replicas` per stage, `copies` pipeline replicas, M microbatches of
/// `microbatch_size` samples per copy.
Plan make_plan(const std::vector<int>& replicas, int copies, int microbatches, ScheduleKind kind,
               RecomputePolicy recompute = RecomputePolicy::None, int microbatch_size = 6) {
  Plan plan;
  plan.planner = "test";
  plan.pipeline_replicas = copies;
  plan.microbatches = microbatches;
  plan.global_batch = static_cast<std::int64_t>(copies) * microbatches * microbatch_size;
  plan.schedule = kind;
  int devices = 0;
  for (std::size_t s = 0; s < replicas.size(); ++s) {
    partrain::PlanStage stage;
    stage.tasks = {static_cast<int>(s)};
    stage.replicas = replicas[s];
    stage.recompute = recompute;
    plan.stages.push_back(stage);
    devices += replicas[s];
  }
  plan.world_size = copies * devices;
  return plan;
}

std::string describe(const std::vector<int>& replicas, int copies, int M, ScheduleKind kind, RecomputePolicy policy) {
  std::string text = "replicas (";
  for (std::size_t s = 0; s < replicas.size(); ++s) {
    if (s) text += ",";
    text += std::to_string(replicas[s]);
  }
  return text + ") copies " + std::to_string(copies) + " M " + std::to_string(M) + " " +
         partrain::schedule_name(kind) + " recompute " + partrain::recompute_name(policy);
}

std::string error_of(const Plan& plan, const Schedule& schedule) {
  return partrain::testing::error_message([&] { partrain::check_schedule(plan, schedule); });
}

std::size_t find_action(const std::vector<Action>& list, ActionKind kind, int microbatch) {
  for (std::size_t k = 0; k < list.size(); ++k)
    if (list[k].kind == kind && list[k].microbatch == microbatch) return k;
  return list.size();
}

const std::vector<std::vector<int>> kReplicaSets = {
    {1}, {2}, {1, 1}, {2, 2}, {1, 3}, {3, 1}, {2, 3}, {1, 1, 1}, {2, 1, 1}, {1, 2, 3}, {1, 1, 1, 1}, {2, 1, 3, 1}};
const std::vector<ScheduleKind> kKinds = {ScheduleKind::GPipe, ScheduleKind::OneForwardOneBackward,
                                          ScheduleKind::ShiftedCriticalPath, ScheduleKind::ZeroBubbleH1};
const std::vector<RecomputePolicy> kPolicies = {RecomputePolicy::None, RecomputePolicy::StageBoundaries,
                                                RecomputePolicy::StageAware};

TEST(Schedule, EveryGeneratedScheduleIsCompleteAndDeadlockFree) {
  int checked = 0;
  for (const auto& replicas : kReplicaSets)
    for (int copies = 1; copies <= 2; ++copies)
      for (int M = 1; M <= 8; ++M)
        for (ScheduleKind kind : kKinds)
          for (RecomputePolicy policy : kPolicies) {
            const Plan plan = make_plan(replicas, copies, M, kind, policy);
            const Schedule schedule = partrain::generate_schedule(plan);
            ASSERT_EQ(static_cast<int>(schedule.size()), plan.world_size);
            EXPECT_EQ(error_of(plan, schedule), "") << describe(replicas, copies, M, kind, policy);
            ++checked;
          }
  EXPECT_EQ(checked, 12 * 2 * 8 * 4 * 3);
}

TEST(Schedule, UnevenMicrobatchSplitsPass) {
  // 5 samples over 2 and 3 replicas: ranges of unequal sizes on both sides.
  for (const auto& replicas : std::vector<std::vector<int>>{{2, 3}, {3, 2}, {1, 4, 2}, {5, 1}})
    for (ScheduleKind kind : kKinds) {
      const Plan plan = make_plan(replicas, 2, 4, kind, RecomputePolicy::StageBoundaries, 5);
      EXPECT_EQ(error_of(plan, partrain::generate_schedule(plan)), "")
          << describe(replicas, 2, 4, kind, RecomputePolicy::StageBoundaries);
    }
}

TEST(Schedule, OneForwardOneBackwardKeepsMinOfStagesLeftAndMicrobatchesInFlight) {
  for (int S = 1; S <= 4; ++S)
    for (int M = 1; M <= 8; ++M) {
      const Plan plan = make_plan(std::vector<int>(S, 1), 1, M, ScheduleKind::OneForwardOneBackward);
      const Schedule schedule = partrain::generate_schedule(plan);
      for (int s = 0; s < S; ++s) EXPECT_EQ(partrain::peak_in_flight(schedule[s]), std::min(S - s, M)) << S << " " << M;
      const Plan gpipe = make_plan(std::vector<int>(S, 1), 1, M, ScheduleKind::GPipe);
      const Schedule gpipe_schedule = partrain::generate_schedule(gpipe);
      for (int s = 0; s < S; ++s) EXPECT_EQ(partrain::peak_in_flight(gpipe_schedule[s]), M);
    }
}

TEST(Schedule, OneForwardOneBackwardOrder) {
  // S = 3, M = 4: stage 0 warms up with 2 forwards, stage 2 alternates from the start.
  const Plan plan = make_plan({1, 1, 1}, 1, 4, ScheduleKind::OneForwardOneBackward);
  const Schedule schedule = partrain::generate_schedule(plan);
  auto compute_order = [](const std::vector<Action>& list) {
    std::string order;
    for (const Action& a : list)
      if (a.kind == ActionKind::Forward || a.kind == ActionKind::Backward)
        order += (a.kind == ActionKind::Forward ? "F" : "B") + std::to_string(a.microbatch) + " ";
    return order;
  };
  EXPECT_EQ(compute_order(schedule[0]), "F0 F1 F2 B0 F3 B1 B2 B3 ");
  EXPECT_EQ(compute_order(schedule[1]), "F0 F1 B0 F2 B1 F3 B2 B3 ");
  EXPECT_EQ(compute_order(schedule[2]), "F0 B0 F1 B1 F2 B2 F3 B3 ");
  const Plan gpipe = make_plan({1, 1, 1}, 1, 4, ScheduleKind::GPipe);
  EXPECT_EQ(compute_order(partrain::generate_schedule(gpipe)[1]), "F0 F1 F2 F3 B3 B2 B1 B0 ");
  // Receives right before the compute that needs them; Step last, no AllReduce without replicas.
  const std::vector<Action>& middle = schedule[1];
  EXPECT_EQ(middle[0], Action::transfer(ActionKind::ReceiveActivation, 0, 0, 0, 6));
  EXPECT_EQ(middle[1], Action::forward(0, 0, 6, false));
  EXPECT_EQ(middle[2], Action::transfer(ActionKind::SendActivation, 0, 2, 0, 6));
  EXPECT_EQ(middle.back(), Action::step());
  EXPECT_EQ(std::count_if(middle.begin(), middle.end(), [](const Action& a) { return a.kind == ActionKind::AllReduce; }),
            0);
}

TEST(Schedule, RecomputeComesRightBeforeBackward) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneForwardOneBackward}) {
    const Plan plan = make_plan({1, 2, 1}, 1, 3, kind, RecomputePolicy::StageBoundaries);
    const Schedule schedule = partrain::generate_schedule(plan);
    for (const auto& list : schedule)
      for (int mb = 0; mb < 3; ++mb) {
        const std::size_t backward = find_action(list, ActionKind::Backward, mb);
        ASSERT_GT(backward, 0u);
        EXPECT_EQ(list[backward - 1].kind, ActionKind::Recompute);
        EXPECT_EQ(list[backward - 1].microbatch, mb);
        EXPECT_TRUE(list[find_action(list, ActionKind::Forward, mb)].activations_recomputed);
      }
  }
  const Plan none = make_plan({1, 1}, 1, 3, ScheduleKind::OneForwardOneBackward);
  for (const auto& list : partrain::generate_schedule(none)) {
    EXPECT_EQ(find_action(list, ActionKind::Recompute, 0), list.size());
    EXPECT_FALSE(list[find_action(list, ActionKind::Forward, 0)].activations_recomputed);
  }
}

TEST(Schedule, RecomputeFollowsEachStagesOwnPolicy) {
  // Stage-aware plans mix policies: only the stages that recompute get Recompute actions.
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneForwardOneBackward}) {
    Plan plan = make_plan({2, 1, 1}, 1, 4, kind);
    plan.stages[0].recompute = RecomputePolicy::StageBoundaries;
    const Schedule schedule = partrain::generate_schedule(plan);
    partrain::check_schedule(plan, schedule);
    for (int rank = 0; rank < plan.world_size; ++rank) {
      const bool recomputes = plan.placement_of(rank).stage == 0;
      const std::vector<partrain::Action>& list = schedule[rank];
      EXPECT_EQ(find_action(list, ActionKind::Recompute, 0) < list.size(), recomputes) << "rank " << rank;
      EXPECT_EQ(list[find_action(list, ActionKind::Forward, 0)].activations_recomputed, recomputes) << "rank " << rank;
    }
  }
}

TEST(Schedule, ShiftedCriticalPathMovesRecomputeOffTheCriticalPath) {
  const int S = 4, M = 6;
  const Plan plan = make_plan(std::vector<int>(S, 1), 1, M, ScheduleKind::ShiftedCriticalPath,
                              RecomputePolicy::StageBoundaries);
  const Schedule schedule = partrain::generate_schedule(plan);
  // The last stage keeps its activations; the others recompute before waiting for the gradient.
  EXPECT_EQ(find_action(schedule[S - 1], ActionKind::Recompute, 0), schedule[S - 1].size());
  EXPECT_FALSE(schedule[S - 1][find_action(schedule[S - 1], ActionKind::Forward, 0)].activations_recomputed);
  for (int s = 0; s < S - 1; ++s)
    for (int mb = 0; mb < M; ++mb) {
      const std::size_t recompute = find_action(schedule[s], ActionKind::Recompute, mb);
      const std::size_t receive = find_action(schedule[s], ActionKind::ReceiveGradient, mb);
      EXPECT_LT(recompute, receive);
      EXPECT_EQ(receive, recompute + 1);
    }
  // With recomputation as long as a forward, SCP predicts a shorter step than 1F1B.
  partrain::TimelineCosts costs;
  costs.forward_seconds.assign(S, 1.0);
  costs.backward_seconds.assign(S, 2.0);
  costs.recompute_seconds.assign(S, 1.0);
  const double scp = partrain::simulate_schedule(plan, schedule, costs).step_seconds;
  Plan one_f_one_b = plan;
  one_f_one_b.schedule = ScheduleKind::OneForwardOneBackward;
  const double baseline =
      partrain::simulate_schedule(one_f_one_b, partrain::generate_schedule(one_f_one_b), costs).step_seconds;
  EXPECT_LT(scp, baseline);
  EXPECT_DOUBLE_EQ(baseline, (M + S - 1) * 4.0);  // every stage: F + R + B = 4 per microbatch
  // Merak §6.1's figure for uniform stages: the bubble shrinks from 3(S − 1)T to 3(S − 2)T over
  // the 4MT of work, and the critical path runs on stage S − 2, which never idles once started.
  EXPECT_DOUBLE_EQ(scp, 4.0 * M + 3.0 * (S - 2));
  const partrain::TimelinePrediction timeline = partrain::simulate_schedule(plan, schedule, costs);
  double busy = 0, first = 1e300, last = 0;
  for (std::size_t i = 0; i < schedule[S - 2].size(); ++i)
    if (schedule[S - 2][i].is_compute()) {
      busy += timeline.timing[S - 2][i].end - timeline.timing[S - 2][i].start;
      first = std::min(first, timeline.timing[S - 2][i].start);
      last = std::max(last, timeline.timing[S - 2][i].end);
    }
  EXPECT_DOUBLE_EQ(last - first, busy);
  // The recomputing stages run one forward more ahead (their boundary inputs held), the last one.
  for (int s = 0; s < S; ++s)
    EXPECT_EQ(partrain::peak_in_flight(schedule[s]), std::min(S - s + (s < S - 1 ? 1 : 0), M)) << "stage " << s;
}

TEST(Schedule, UnequalReplicasExchangeExactlyTheIntersections) {
  // Stage 0: 2 replicas ([0,3), [3,6)); stage 1: 3 replicas ([0,2), [2,4), [4,6)). Ranks 0-1, 2-4.
  const Plan plan = make_plan({2, 3}, 1, 2, ScheduleKind::OneForwardOneBackward);
  const Schedule schedule = partrain::generate_schedule(plan);
  auto sends = [](const std::vector<Action>& list, ActionKind kind, int mb) {
    std::vector<Action> found;
    for (const Action& a : list)
      if (a.kind == kind && a.microbatch == mb) found.push_back(a);
    return found;
  };
  using V = std::vector<Action>;
  EXPECT_EQ(sends(schedule[0], ActionKind::SendActivation, 1),
            (V{Action::transfer(ActionKind::SendActivation, 1, 2, 0, 2),
               Action::transfer(ActionKind::SendActivation, 1, 3, 2, 3)}));
  EXPECT_EQ(sends(schedule[1], ActionKind::SendActivation, 0),
            (V{Action::transfer(ActionKind::SendActivation, 0, 3, 3, 4),
               Action::transfer(ActionKind::SendActivation, 0, 4, 4, 6)}));
  EXPECT_EQ(sends(schedule[3], ActionKind::ReceiveActivation, 0),
            (V{Action::transfer(ActionKind::ReceiveActivation, 0, 0, 2, 3),
               Action::transfer(ActionKind::ReceiveActivation, 0, 1, 3, 4)}));
  EXPECT_EQ(sends(schedule[3], ActionKind::SendGradient, 1),
            (V{Action::transfer(ActionKind::SendGradient, 1, 0, 2, 3),
               Action::transfer(ActionKind::SendGradient, 1, 1, 3, 4)}));
  EXPECT_EQ(sends(schedule[0], ActionKind::ReceiveGradient, 0),
            (V{Action::transfer(ActionKind::ReceiveGradient, 0, 2, 0, 2),
               Action::transfer(ActionKind::ReceiveGradient, 0, 3, 2, 3)}));
  EXPECT_EQ(schedule[3][find_action(schedule[3], ActionKind::Forward, 0)], Action::forward(0, 2, 4, false));
  EXPECT_EQ(schedule[3][schedule[3].size() - 2], Action::all_reduce({2, 3, 4}));
}

TEST(Schedule, PipelineReplicasOnlyShareTheAllReduce) {
  const Plan plan = make_plan({2, 1}, 2, 3, ScheduleKind::GPipe);  // ranks 0-2 pipeline replica 0, 3-5 pipeline replica 1
  const Schedule schedule = partrain::generate_schedule(plan);
  for (int rank = 0; rank < plan.world_size; ++rank)
    for (const Action& a : schedule[rank]) {
      if (a.is_send() || a.is_receive()) {
        EXPECT_EQ(plan.placement_of(a.peer).pipeline_replica, plan.placement_of(rank).pipeline_replica) << a.to_string();
      }
      if (a.kind == ActionKind::AllReduce) {
        EXPECT_EQ(a.group, plan.placement_of(rank).stage == 0 ? (std::vector<int>{0, 1, 3, 4})
                                                              : (std::vector<int>{2, 5}));
      }
    }
}

TEST(Schedule, CheckerReportsDeadlock) {
  // Stage 1 waits for microbatch 1 first, but stage 0 (1F1B, 2 stages) sends it only after the
  // gradient of microbatch 0.
  const Plan plan = make_plan({1, 1}, 1, 2, ScheduleKind::OneForwardOneBackward);
  Schedule schedule = partrain::generate_schedule(plan);
  ASSERT_EQ(error_of(plan, schedule), "");
  schedule[0] = {Action::forward(0, 0, 6, false),
                 Action::transfer(ActionKind::SendActivation, 0, 1, 0, 6),
                 Action::transfer(ActionKind::ReceiveGradient, 0, 1, 0, 6),
                 Action::backward(0, 0, 6),
                 Action::forward(1, 0, 6, false),
                 Action::transfer(ActionKind::SendActivation, 1, 1, 0, 6),
                 Action::transfer(ActionKind::ReceiveGradient, 1, 1, 0, 6),
                 Action::backward(1, 0, 6),
                 Action::step()};
  schedule[1] = {Action::transfer(ActionKind::ReceiveActivation, 1, 0, 0, 6),
                 Action::forward(1, 0, 6, false),
                 Action::transfer(ActionKind::ReceiveActivation, 0, 0, 0, 6),
                 Action::forward(0, 0, 6, false),
                 Action::backward(0, 0, 6),
                 Action::transfer(ActionKind::SendGradient, 0, 0, 0, 6),
                 Action::backward(1, 0, 6),
                 Action::transfer(ActionKind::SendGradient, 1, 0, 0, 6),
                 Action::step()};
  const std::string message = error_of(plan, schedule);
  EXPECT_NE(message.find("deadlock"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 (pipeline replica 0, stage 0, replica 0) waits at action #2 ReceiveGradient(mb 0"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 1 (pipeline replica 0, stage 1, replica 0) waits at action #0 ReceiveActivation(mb 1"),
            std::string::npos)
      << message;
  partrain::TimelineCosts costs;
  costs.forward_seconds = costs.backward_seconds = {1.0, 1.0};
  costs.recompute_seconds = {0.0, 0.0};
  EXPECT_THROW(partrain::simulate_schedule(plan, schedule, costs), partrain::Error);
}

TEST(Schedule, CheckerReportsRanksStuckInAllReduce) {
  // Two pipeline replicas of two stages; pipeline replica 1 (ranks 2, 3) has a point-to-point deadlock, so pipeline replica 0's
  // ranks wait forever in their all-reduces with them.
  const Plan plan = make_plan({1, 1}, 2, 2, ScheduleKind::GPipe);
  Schedule schedule = partrain::generate_schedule(plan);
  ASSERT_EQ(error_of(plan, schedule), "");
  // Rank 3 receives microbatch 1 before microbatch 0; rank 2 sends microbatch 1 only after
  // receiving the gradient of microbatch 0 (its list is made 1F1B-like).
  std::vector<Action>& last = schedule[3];
  const std::size_t first_receive = find_action(last, ActionKind::ReceiveActivation, 0);
  const std::size_t second_receive = find_action(last, ActionKind::ReceiveActivation, 1);
  std::swap(last[first_receive], last[second_receive]);
  std::swap(last[first_receive + 1], last[second_receive + 1]);  // the forwards follow their receives
  schedule[2] = {Action::forward(0, 0, 6, false),
                 Action::transfer(ActionKind::SendActivation, 0, 3, 0, 6),
                 Action::transfer(ActionKind::ReceiveGradient, 0, 3, 0, 6),
                 Action::backward(0, 0, 6),
                 Action::forward(1, 0, 6, false),
                 Action::transfer(ActionKind::SendActivation, 1, 3, 0, 6),
                 Action::transfer(ActionKind::ReceiveGradient, 1, 3, 0, 6),
                 Action::backward(1, 0, 6),
                 Action::all_reduce({0, 2}),
                 Action::step()};
  const std::string message = error_of(plan, schedule);
  EXPECT_NE(message.find("deadlock"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 (pipeline replica 0, stage 0, replica 0) waits at action #"), std::string::npos) << message;
  EXPECT_NE(message.find("AllReduce(ranks 0,2)"), std::string::npos) << message;
  EXPECT_NE(message.find("AllReduce(ranks 1,3)"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 2 (pipeline replica 1, stage 0, replica 0) waits at action #2 ReceiveGradient(mb 0"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 3 (pipeline replica 1, stage 1, replica 0) waits at action #0 ReceiveActivation(mb 1"),
            std::string::npos)
      << message;
  // An AllReduce before the last backward is rejected outright.
  Schedule early = partrain::generate_schedule(plan);
  std::vector<Action>& first = early[0];
  const Action all_reduce = first[first.size() - 2];
  ASSERT_EQ(all_reduce.kind, ActionKind::AllReduce);
  first.erase(first.end() - 2);
  first.insert(first.begin(), all_reduce);
  EXPECT_NE(error_of(plan, early).find("comes before Backward"), std::string::npos);
}

TEST(Schedule, CheckerReportsMismatchedRanges) {
  const Plan plan = make_plan({1, 3}, 1, 2, ScheduleKind::OneForwardOneBackward, RecomputePolicy::None, 5);
  const Schedule good = partrain::generate_schedule(plan);
  ASSERT_EQ(error_of(plan, good), "");
  // A receive that expects the wrong samples.
  Schedule bad = good;
  const std::size_t receive = find_action(bad[2], ActionKind::ReceiveActivation, 1);
  ASSERT_LT(receive, bad[2].size());
  bad[2][receive].sample_end += 1;
  std::string message = error_of(plan, bad);
  EXPECT_NE(message.find("samples"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 2"), std::string::npos) << message;
  // A send and its receive that agree with each other but not with the replicas' ranges.
  bad = good;
  for (auto* list : {&bad[0], &bad[1]})
    for (Action& a : *list)
      if ((a.kind == ActionKind::SendActivation && a.peer == 1) || a.kind == ActionKind::ReceiveActivation) {
        a.sample_end = 1;
      }
  message = error_of(plan, bad);
  EXPECT_NE(message.find("samples shared"), std::string::npos) << message;
  // Sender and receiver disagree: the simulator (which skips the per-rank checks) names both ends.
  bad = good;
  for (Action& a : bad[0])
    if (a.kind == ActionKind::SendActivation && a.peer == 1 && a.microbatch == 0) a.sample_begin = 1;
  partrain::TimelineCosts costs;
  costs.forward_seconds = costs.backward_seconds = costs.recompute_seconds = {1.0, 1.0};
  try {
    partrain::simulate_schedule(plan, bad, costs);
    ADD_FAILURE() << "no error";
  } catch (const partrain::Error& error) {
    message = error.message();
  }
  EXPECT_NE(message.find("receives samples [1,2) from rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 (pipeline replica 0, stage 1, replica 0)"), std::string::npos) << message;
  EXPECT_NE(error_of(plan, bad).find("samples shared with rank 1 are [0,2)"), std::string::npos);
}

TEST(Schedule, CheckerReportsIncompleteLists) {
  const Plan plan = make_plan({1, 1}, 1, 3, ScheduleKind::GPipe, RecomputePolicy::StageBoundaries);
  const Schedule good = partrain::generate_schedule(plan);
  auto without = [&](int rank, ActionKind kind, int mb) {
    Schedule schedule = good;
    auto& list = schedule[rank];
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(find_action(list, kind, mb)));
    return error_of(plan, schedule);
  };
  EXPECT_NE(without(1, ActionKind::Backward, 1).find("SendGradient(mb 1, to 0, samples [0,6)) before its Backward"),
            std::string::npos);
  EXPECT_NE(without(0, ActionKind::Backward, 1).find("microbatch 1 forward 1 and backward 0 times"), std::string::npos);
  EXPECT_NE(without(1, ActionKind::Recompute, 2).find("has no Recompute"), std::string::npos);
  EXPECT_NE(without(0, ActionKind::SendActivation, 0), "");
  EXPECT_NE(without(1, ActionKind::ReceiveActivation, 0).find("before receiving"), std::string::npos);
  EXPECT_NE(without(1, ActionKind::Step, -1).find("Step"), std::string::npos);
  // Step not last.
  Schedule schedule = good;
  std::swap(schedule[0][schedule[0].size() - 1], schedule[0][schedule[0].size() - 2]);
  EXPECT_NE(error_of(plan, schedule).find("after Step"), std::string::npos);
  // A forward twice.
  schedule = good;
  schedule[0].insert(schedule[0].begin(), schedule[0][find_action(schedule[0], ActionKind::Forward, 0)]);
  EXPECT_NE(error_of(plan, schedule).find("repeated"), std::string::npos);
  // An activation sent to another pipeline replica.
  const Plan copies = make_plan({1, 1}, 2, 1, ScheduleKind::GPipe);
  schedule = partrain::generate_schedule(copies);
  schedule[0][find_action(schedule[0], ActionKind::SendActivation, 0)].peer = 3;
  EXPECT_NE(error_of(copies, schedule).find("same pipeline replica"), std::string::npos);
  // A wrong number of lists.
  schedule = good;
  schedule.pop_back();
  EXPECT_NE(error_of(plan, schedule).find("lists"), std::string::npos);
}

TEST(Schedule, GPipeBubbleFractionWithEqualStageTimes) {
  for (int S = 1; S <= 4; ++S)
    for (int M = 1; M <= 8; ++M)
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneForwardOneBackward}) {
        const Plan plan = make_plan(std::vector<int>(S, 1), 1, M, kind);
        partrain::TimelineCosts costs;
        costs.forward_seconds.assign(S, 1.0);
        costs.backward_seconds.assign(S, 2.0);
        costs.recompute_seconds.assign(S, 0.0);
        const auto prediction = partrain::simulate_schedule(plan, partrain::generate_schedule(plan), costs);
        EXPECT_NEAR(prediction.bubble_fraction, static_cast<double>(S - 1) / (M + S - 1), 1e-12) << S << " " << M;
        EXPECT_DOUBLE_EQ(prediction.pipeline_seconds, 3.0 * (M + S - 1));
        EXPECT_DOUBLE_EQ(prediction.step_seconds, prediction.pipeline_seconds);
        for (double busy : prediction.rank_compute_seconds) EXPECT_DOUBLE_EQ(busy, 3.0 * M);
      }
}

// ZB-H1 (Qi et al. 2024 §2.1) with F = B = W = 1 (a whole backward 2): every stage holds min(S, M)
// microbatches between Forward and BackwardWeight, and for M ≥ S the step takes 3M + S − 1 where
// 1F1B takes 3(M + S − 1): the bubble (S − 1)/(3M + S − 1), a third of 1F1B's idle time.
TEST(Schedule, ZeroBubbleH1TakesAThirdOfTheBubble) {
  for (int S = 1; S <= 6; ++S)
    for (int M = 1; M <= 12; ++M) {
      const Plan plan = make_plan(std::vector<int>(S, 1), 1, M, ScheduleKind::ZeroBubbleH1);
      const Schedule schedule = partrain::generate_schedule(plan);
      for (int s = 0; s < S; ++s) EXPECT_EQ(partrain::peak_in_flight(schedule[s]), std::min(S, M)) << S << " " << M;
      EXPECT_EQ(partrain::microbatches_in_flight(ScheduleKind::ZeroBubbleH1, S - 1, S, M, false), std::min(S, M));
      partrain::TimelineCosts costs;
      costs.forward_seconds.assign(S, 1.0);
      costs.backward_seconds.assign(S, 2.0);
      costs.recompute_seconds.assign(S, 0.0);
      costs.weight_gradient_seconds.assign(S, 1.0);
      const auto prediction = partrain::simulate_schedule(plan, schedule, costs);
      for (double busy : prediction.rank_compute_seconds) EXPECT_DOUBLE_EQ(busy, 3.0 * M);
      if (M >= S) {
        EXPECT_DOUBLE_EQ(prediction.pipeline_seconds, 3.0 * M + S - 1) << S << " " << M;
        EXPECT_NEAR(prediction.bubble_fraction, static_cast<double>(S - 1) / (3 * M + S - 1), 1e-12);
      }
      // Never slower than 1F1B on the same costs (a whole Backward costs B + W).
      const Plan one_f_one_b = make_plan(std::vector<int>(S, 1), 1, M, ScheduleKind::OneForwardOneBackward);
      const auto baseline = partrain::simulate_schedule(one_f_one_b, partrain::generate_schedule(one_f_one_b), costs);
      EXPECT_DOUBLE_EQ(baseline.pipeline_seconds, 3.0 * (M + S - 1));
      EXPECT_LE(prediction.pipeline_seconds, baseline.pipeline_seconds) << S << " " << M;
    }
}

// The lists and the timeline of S = 2, M = 3, derived by hand (F = B = W = 1, free transfers):
// stage 0: F0 0-1, F1 1-2, B0 3-4 (after stage 1's B0 2-3), W0 4-5, F2 5-6, B1 6-7, W1 7-8, B2 8-9,
//          W2 9-10;
// stage 1: F0 1-2, B0 2-3, F1 3-4, B1 4-5, W0 5-6, F2 6-7, B2 7-8, W1 8-9, W2 9-10.
TEST(Schedule, ZeroBubbleH1HandDerivedTimeline) {
  const Plan plan = make_plan({1, 1}, 1, 3, ScheduleKind::ZeroBubbleH1);
  const Schedule schedule = partrain::generate_schedule(plan);
  partrain::TimelineCosts costs;
  costs.forward_seconds = {1, 1};
  costs.backward_seconds = {2, 2};
  costs.recompute_seconds = {0, 0};
  costs.weight_gradient_seconds = {1, 1};
  const auto prediction = partrain::simulate_schedule(plan, schedule, costs);
  const std::vector<std::vector<std::string>> expected = {
      {"F0 0-1", "F1 1-2", "B0 3-4", "W0 4-5", "F2 5-6", "B1 6-7", "W1 7-8", "B2 8-9", "W2 9-10"},
      {"F0 1-2", "B0 2-3", "F1 3-4", "B1 4-5", "W0 5-6", "F2 6-7", "B2 7-8", "W1 8-9", "W2 9-10"}};
  for (int s = 0; s < 2; ++s) {
    std::vector<std::string> timeline;
    for (std::size_t k = 0; k < schedule[s].size(); ++k) {
      const Action& action = schedule[s][k];
      const char* letter = action.kind == ActionKind::Forward         ? "F"
                           : action.kind == ActionKind::BackwardInput  ? "B"
                           : action.kind == ActionKind::BackwardWeight ? "W"
                                                                       : nullptr;
      if (letter == nullptr) continue;
      const auto& t = prediction.timing[s][k];
      timeline.push_back(letter + std::to_string(action.microbatch) + " " + std::to_string(static_cast<int>(t.start)) +
                         "-" + std::to_string(static_cast<int>(t.end)));
    }
    EXPECT_EQ(timeline, expected[s]) << "stage " << s;
  }
  EXPECT_DOUBLE_EQ(prediction.step_seconds, 10.0);
}

// A zb_v plan: 2S model chunks, chunk c on stage c (c < S) or 2S − 1 − c, with its stage's replicas.
Plan make_v_plan(const std::vector<int>& replicas, int copies, int microbatches,
                 RecomputePolicy recompute = RecomputePolicy::None) {
  const int S = static_cast<int>(replicas.size());
  std::vector<int> chunk_replicas;
  for (int c = 0; c < 2 * S; ++c) chunk_replicas.push_back(replicas[partrain::stage_of_chunk(ScheduleKind::ZeroBubbleV, c, S)]);
  Plan plan = make_plan(chunk_replicas, copies, microbatches, ScheduleKind::ZeroBubbleV, recompute);
  plan.virtual_stages = 2;
  plan.world_size /= 2;  // make_plan counted every chunk's replicas as devices
  return plan;
}

TEST(Schedule, ZeroBubbleVIsCompleteAndDeadlockFree) {
  int checked = 0;
  for (const auto& replicas : std::vector<std::vector<int>>{{1}, {2}, {1, 1}, {2, 2}, {1, 3}, {1, 1, 1}, {2, 1, 3, 1}})
    for (int copies = 1; copies <= 2; ++copies)
      for (int M = 1; M <= 8; ++M)
        for (RecomputePolicy policy : kPolicies) {
          const Plan plan = make_v_plan(replicas, copies, M, policy);
          const Schedule schedule = partrain::generate_schedule(plan);
          ASSERT_EQ(static_cast<int>(schedule.size()), plan.world_size);
          EXPECT_EQ(error_of(plan, schedule), "") << describe(replicas, copies, M, ScheduleKind::ZeroBubbleV, policy);
          ++checked;
        }
  EXPECT_EQ(checked, 7 * 2 * 8 * 3);
}

// ZB-V with F = B = W = 1 per chunk: rank S − 1 cannot start before its first input arrives at S − 1
// and has 6M of work, so no schedule ends before 6M + S − 1; the greedy reaches that bound for M = S
// and M ≥ 2S (within S − 2 in between), keeps at most 2S chunk-microbatches before their W (1F1B's
// first stage's memory) and has less than half 1F1B's bubble (S − 1)/(M + S − 1).
TEST(Schedule, ZeroBubbleVReachesTheLowerBound) {
  for (int S = 1; S <= 6; ++S)
    for (int M = S; M <= 12; ++M) {
      const Plan plan = make_v_plan(std::vector<int>(S, 1), 1, M);
      const Schedule schedule = partrain::generate_schedule(plan);
      partrain::TimelineCosts costs;
      costs.forward_seconds.assign(2 * S, 1.0);
      costs.backward_seconds.assign(2 * S, 2.0);
      costs.recompute_seconds.assign(2 * S, 0.0);
      costs.weight_gradient_seconds.assign(2 * S, 1.0);
      const auto prediction = partrain::simulate_schedule(plan, schedule, costs);
      const double bound = 6.0 * M + S - 1;
      EXPECT_GE(prediction.pipeline_seconds, bound) << "S " << S << " M " << M;
      if (M == S || M >= 2 * S) {
        EXPECT_DOUBLE_EQ(prediction.pipeline_seconds, bound) << "S " << S << " M " << M;
      } else {
        EXPECT_LE(prediction.pipeline_seconds, bound + std::max(0, S - 2)) << "S " << S << " M " << M;
      }
      for (int s = 0; s < S; ++s) EXPECT_LE(partrain::peak_in_flight(schedule[s]), 2 * S) << "S " << S << " M " << M;
      EXPECT_LE(prediction.bubble_fraction, 0.5 * (S - 1) / (M + S - 1)) << "S " << S << " M " << M;
    }
}

TEST(Schedule, CheckerRequiresEachBackwardWeightAfterItsBackwardInput) {
  const Plan plan = make_plan({1, 1}, 1, 3, ScheduleKind::ZeroBubbleH1);
  const Schedule good = partrain::generate_schedule(plan);
  Schedule missing = good;  // stage 0 without W of microbatch 1
  missing[0].erase(missing[0].begin() + static_cast<std::ptrdiff_t>(find_action(missing[0], ActionKind::BackwardWeight, 1)));
  EXPECT_NE(error_of(plan, missing).find("never runs BackwardWeight of microbatch 1"), std::string::npos) << error_of(plan, missing);
  Schedule early = good;  // W of microbatch 0 moved before its B
  auto& list = early[1];
  const std::size_t weight = find_action(list, ActionKind::BackwardWeight, 0);
  const Action moved = list[weight];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(weight));
  list.insert(list.begin() + static_cast<std::ptrdiff_t>(find_action(list, ActionKind::BackwardInput, 0)), moved);
  EXPECT_NE(error_of(plan, early).find("before its BackwardInput"), std::string::npos) << error_of(plan, early);
}

// Why predictions simulate instead of using (M + S − 1) · max(f + b): a stage slow in forward before
// one slow in backward. GPipe, M = 2, f = (10, 1), b = (1, 10): stage 0 forwards at 0-10 and 10-20,
// stage 1 at 10-11 and 20-21, then its backwards 21-31 and 31-41, stage 0's last backward 41-42.
// The closed form says 3 · 11 = 33. 1F1B interleaves: s1 F0 10-11, B0 11-21, F1 21-22 (s0 sent it at
// 20), B1 22-32; s0 B0 21-22, B1 32-33: 33.
TEST(Schedule, SimulatorSeesWhatTheClosedFormMisses) {
  for (const auto& [kind, expected] : {std::pair{ScheduleKind::GPipe, 42.0}, std::pair{ScheduleKind::OneForwardOneBackward, 33.0}}) {
    const Plan plan = make_plan({1, 1}, 1, 2, kind);
    partrain::TimelineCosts costs;
    costs.forward_seconds = {10.0, 1.0};
    costs.backward_seconds = {1.0, 10.0};
    costs.recompute_seconds = {0.0, 0.0};
    const auto prediction = partrain::simulate_schedule(plan, partrain::generate_schedule(plan), costs);
    EXPECT_DOUBLE_EQ(prediction.step_seconds, expected) << schedule_name(kind);
  }
}

TEST(Schedule, SimulatorChargesTransfersAllReduceAndStep) {
  // Two stages, two copies, one microbatch: F0 | send 0.5 | F1, B1 | send 0.5 | B0, all-reduce, step.
  const Plan plan = make_plan({1, 1}, 2, 1, ScheduleKind::OneForwardOneBackward);
  partrain::TimelineCosts costs;
  costs.forward_seconds = {1.0, 2.0};
  costs.backward_seconds = {1.5, 3.0};
  costs.recompute_seconds = {0.0, 0.0};
  costs.transfer_seconds = [](ActionKind, int, int, std::int64_t samples) { return samples / 12.0; };  // 0.5
  costs.all_reduce_seconds = [](int stage) { return stage == 0 ? 0.25 : 0.75; };
  costs.step_seconds = 0.125;
  const auto prediction = partrain::simulate_schedule(plan, partrain::generate_schedule(plan), costs);
  EXPECT_DOUBLE_EQ(prediction.pipeline_seconds, 1.0 + 0.5 + 2.0 + 3.0 + 0.5 + 1.5);
  EXPECT_DOUBLE_EQ(prediction.step_seconds, 8.5 + 0.25 + 0.125);
  EXPECT_NEAR(prediction.bubble_fraction, 1.0 - (2 * 2.5 + 2 * 5.0) / (4 * 8.5), 1e-12);
  ASSERT_EQ(prediction.timing.size(), 4u);
  EXPECT_DOUBLE_EQ(prediction.timing[1][1].start, 1.5);  // stage 1's forward starts when the activation lands
  EXPECT_THROW(partrain::simulate_schedule(plan, partrain::generate_schedule(plan), partrain::TimelineCosts{}),
               partrain::Error);
}

TEST(Schedule, CostsFromPlanSplitTheRecomputation) {
  Plan plan = make_plan({1, 1}, 1, 2, ScheduleKind::GPipe, RecomputePolicy::StageBoundaries);
  plan.stages[0].forward_seconds = 1.0;
  plan.stages[0].backward_seconds = 3.0;
  plan.stages[1].recompute = RecomputePolicy::None;
  plan.stages[1].forward_seconds = 2.0;
  plan.stages[1].backward_seconds = 4.0;
  const auto costs = partrain::TimelineCosts::from_plan(plan);
  EXPECT_EQ(costs.forward_seconds, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(costs.backward_seconds, (std::vector<double>{2.0, 4.0}));
  EXPECT_EQ(costs.recompute_seconds, (std::vector<double>{1.0, 0.0}));
  EXPECT_DOUBLE_EQ(costs.all_reduce_seconds(1), 0.0);
  plan.stages[1].allreduce_seconds = 0.5;
  EXPECT_DOUBLE_EQ(partrain::TimelineCosts::from_plan(plan).all_reduce_seconds(1), 0.5);
  // Each stage's optimizer step ends its list: the step time grows by the slowest stage's, as the
  // stages step in parallel once their backwards are done.
  const double before = partrain::simulate_schedule(plan, partrain::generate_schedule(plan),
                                                    partrain::TimelineCosts::from_plan(plan)).step_seconds;
  plan.stages[0].optimizer_seconds = 0.25;
  plan.stages[1].optimizer_seconds = 0.125;
  const auto with_steps = partrain::TimelineCosts::from_plan(plan);
  EXPECT_EQ(with_steps.stage_step_seconds, (std::vector<double>{0.25, 0.125}));
  // GPipe, stage 0 finishes its backwards last: its 0.25 s step is the tail.
  EXPECT_DOUBLE_EQ(partrain::simulate_schedule(plan, partrain::generate_schedule(plan), with_steps).step_seconds,
                   before + 0.25);
}

// The runtime's optimizer step (runtime/executor.cpp, optimizer_step) all-reduces the tied
// parameters over the stages sharing them, then the gradient norm over the world: a barrier.
// GPipe, one microbatch: F0 [0,1], F1 [1,3], B1 [3,6], B0 [6,7.5]; steps 0.25 and 1.0.
TEST(Schedule, SynchronizedStepWaitsForTheLastRankAndTheTiedAllReduce) {
  const Plan plan = make_plan({1, 1}, 1, 1, ScheduleKind::GPipe);
  partrain::TimelineCosts costs;
  costs.forward_seconds = {1.0, 2.0};
  costs.backward_seconds = {1.5, 3.0};
  costs.recompute_seconds = {0.0, 0.0};
  costs.stage_step_seconds = {0.25, 1.0};
  const auto step_seconds = [&] {
    return partrain::simulate_schedule(plan, partrain::generate_schedule(plan), costs).step_seconds;
  };
  EXPECT_DOUBLE_EQ(step_seconds(), std::max(7.5 + 0.25, 6.0 + 1.0));  // each rank steps on arrival
  costs.synchronized_step = true;
  EXPECT_DOUBLE_EQ(step_seconds(), 7.5 + 1.0);  // stage 1 waits for stage 0, then steps for 1.0
  costs.tied_all_reduce_seconds = {0.5, 0.5};
  const auto prediction = partrain::simulate_schedule(plan, partrain::generate_schedule(plan), costs);
  EXPECT_DOUBLE_EQ(prediction.step_seconds, 7.5 + 0.5 + 1.0);  // tied all-reduce from 7.5, barrier at 8
  EXPECT_DOUBLE_EQ(prediction.timing[1].back().start, 6.0);     // the Step holds stage 1's wait, as traced
  EXPECT_DOUBLE_EQ(prediction.timing[0].back().end, 8.0 + 0.25);
  costs.tied_all_reduce_seconds = {0.5, -1.0};
  EXPECT_THROW(step_seconds(), partrain::Error);

  Plan predicted = plan;
  predicted.stages[0].tied_allreduce_seconds = 0.5;
  predicted.stages[1].tied_allreduce_seconds = 0.5;
  const partrain::TimelineCosts from_plan = partrain::TimelineCosts::from_plan(predicted);
  EXPECT_TRUE(from_plan.synchronized_step);
  EXPECT_EQ(from_plan.tied_all_reduce_seconds, (std::vector<double>{0.5, 0.5}));
  EXPECT_DOUBLE_EQ(partrain::Plan::from_json(predicted.to_json(), "plan.json").stages[1].tied_allreduce_seconds, 0.5);
}

// Ranks sharing a node's cores (simulate_schedule_on_shared_cores). With a core per rank the
// event-driven engine must give the Runner's timeline, action by action, over the plan grid: two
// independent implementations of the same rules.
TEST(Schedule, SharedCoresWithACorePerRankGiveTheRunnersTimeline) {
  std::uint64_t state = 12345;
  const auto draw = [&state] {  // deterministic costs in [0.5, 2.5)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return 0.5 + 2.0 * static_cast<double>(state >> 11) / 9007199254740992.0;
  };
  int compared = 0;
  for (const auto& replicas : kReplicaSets)
    for (ScheduleKind kind : kKinds)
      for (int copies : {1, 2})
        for (int M : {1, 3, 5}) {
          const Plan plan = make_plan(replicas, copies, M, kind, RecomputePolicy::StageBoundaries);
          partrain::TimelineCosts costs;
          for (std::size_t s = 0; s < plan.stages.size(); ++s) {
            costs.forward_seconds.push_back(draw());
            costs.backward_seconds.push_back(2 * draw());
            costs.recompute_seconds.push_back(draw());
            costs.weight_gradient_seconds.push_back(0.4 * costs.backward_seconds.back());
            costs.stage_step_seconds.push_back(0.1 * draw());
            costs.tied_all_reduce_seconds.push_back(s == 0 || s + 1 == plan.stages.size() ? 0.25 : 0.0);
          }
          costs.transfer_seconds = [](ActionKind kind, int from, int to, std::int64_t samples) {
            return 0.01 * samples + (kind == ActionKind::SendGradient ? 0.05 : 0.0) + 0.001 * (from + 2 * to);
          };
          costs.all_reduce_seconds = [](int stage) { return 0.3 + 0.1 * stage; };
          costs.synchronized_step = (M % 2) == 1;
          const partrain::Schedule schedule = partrain::generate_schedule(plan);
          const auto runner = partrain::simulate_schedule(plan, schedule, costs);
          costs.ranks_per_node = 2;
          costs.concurrent_ranks_per_node = 2;  // a core for each rank of the node
          const auto shared = partrain::simulate_schedule_on_shared_cores(plan, schedule, costs);
          const std::string where = describe(replicas, copies, M, kind, RecomputePolicy::StageBoundaries);
          ASSERT_NEAR(shared.step_seconds, runner.step_seconds, 1e-9) << where;
          EXPECT_NEAR(shared.bubble_fraction, runner.bubble_fraction, 1e-9) << where;
          for (std::size_t r = 0; r < schedule.size(); ++r)
            for (std::size_t k = 0; k < schedule[r].size(); ++k) {
              ASSERT_NEAR(shared.timing[r][k].start, runner.timing[r][k].start, 1e-9) << where << " rank " << r << " #" << k;
              ASSERT_NEAR(shared.timing[r][k].end, runner.timing[r][k].end, 1e-9) << where << " rank " << r << " #" << k;
            }
          ++compared;
        }
  EXPECT_EQ(compared, static_cast<int>(kReplicaSets.size() * kKinds.size()) * 2 * 3);
}

// Two ranks on one core, worked by hand. GPipe, two stages, two microbatches, forward 1 and backward 2
// on a core of one's own, free transfers: F0(0) [0,1] alone; F0(1) and F1(0) share the core, [1,3];
// F1(1) alone [3,4]; stage 1's first backward alone [4,6]; its second and stage 0's first share
// [6,10]; stage 0's second alone [10,12]. The core is never idle: 12 s, the whole work on one core
// (9 s with a core each).
TEST(Schedule, RanksSharingACoreProgressAtTheirShare) {
  const Plan plan = make_plan({1, 1}, 1, 2, ScheduleKind::GPipe);
  partrain::TimelineCosts costs;
  costs.forward_seconds = {1.0, 1.0};
  costs.backward_seconds = {2.0, 2.0};
  costs.recompute_seconds = {0.0, 0.0};
  const partrain::Schedule schedule = partrain::generate_schedule(plan);
  EXPECT_DOUBLE_EQ(partrain::simulate_schedule(plan, schedule, costs).step_seconds, 9.0);
  costs.ranks_per_node = 2;
  costs.concurrent_ranks_per_node = 1;
  ASSERT_TRUE(costs.shares_cores());
  const auto shared = partrain::simulate_schedule(plan, schedule, costs);  // dispatches to the shared engine
  EXPECT_NEAR(shared.step_seconds, 12.0, 1e-12);
  const std::size_t f1 = find_action(schedule[1], ActionKind::Forward, 0);
  EXPECT_NEAR(shared.timing[1][f1].start, 1.0, 1e-12);
  EXPECT_NEAR(shared.timing[1][f1].end, 3.0, 1e-12);
  std::vector<double> stage0_backward_ends;
  for (std::size_t k = 0; k < schedule[0].size(); ++k)
    if (schedule[0][k].kind == ActionKind::Backward) stage0_backward_ends.push_back(shared.timing[0][k].end);
  EXPECT_EQ(stage0_backward_ends.size(), 2u);
  EXPECT_NEAR(stage0_backward_ends.front(), 10.0, 1e-12);
  EXPECT_NEAR(stage0_backward_ends.back(), 12.0, 1e-12);
  // Two ranks per node on two nodes of one core each: the stages are on different nodes and share nothing.
  costs.ranks_per_node = 1;
  EXPECT_FALSE(costs.shares_cores());
  costs.ranks_per_node = 2;
  costs.concurrent_ranks_per_node = 0.5;  // half a core for the node: every rate halves
  EXPECT_NEAR(partrain::simulate_schedule(plan, schedule, costs).step_seconds, 24.0, 1e-12);

  // Data parallelism keeps both ranks busy: forward 1, backward 2, all-reduce 0.5, synchronized
  // step 0.25 each, on one core: [0,2], [2,6], [6,6.5], then both steps [6.5,7].
  const Plan replicated = make_plan({2}, 1, 1, ScheduleKind::OneForwardOneBackward);
  partrain::TimelineCosts both;
  both.forward_seconds = {1.0};
  both.backward_seconds = {2.0};
  both.recompute_seconds = {0.0};
  both.all_reduce_seconds = [](int) { return 0.5; };
  both.stage_step_seconds = {0.25};
  both.synchronized_step = true;
  both.ranks_per_node = 2;
  both.concurrent_ranks_per_node = 1;
  EXPECT_NEAR(partrain::simulate_schedule(replicated, partrain::generate_schedule(replicated), both).step_seconds,
              7.0, 1e-12);
  both.concurrent_ranks_per_node = -1;
  both.ranks_per_node = 2;
  EXPECT_THROW(partrain::simulate_schedule_on_shared_cores(replicated, partrain::generate_schedule(replicated), both),
               partrain::Error);
}

// A plan predicted where ranks share cores keeps the sharing (plan files, `partrain simulate`).
TEST(Schedule, CostsFromPlanShareTheCoresThePlanWasPredictedFor) {
  Plan plan = make_plan({1, 1}, 1, 2, ScheduleKind::GPipe);
  for (partrain::PlanStage& stage : plan.stages) {
    stage.forward_seconds = 1.0;
    stage.backward_seconds = 2.0;
  }
  plan.ranks_per_node = 2;
  plan.concurrent_ranks_per_node = 1;
  const Plan reread = Plan::from_json(plan.to_json(), "plan.json");
  EXPECT_EQ(reread.ranks_per_node, 2);
  EXPECT_DOUBLE_EQ(reread.concurrent_ranks_per_node, 1.0);
  const auto costs = partrain::TimelineCosts::from_plan(reread);
  EXPECT_TRUE(costs.shares_cores());
  EXPECT_NEAR(partrain::simulate_schedule(reread, partrain::generate_schedule(reread), costs).step_seconds, 12.0, 1e-12);
}

TEST(Schedule, GeneratorRejectsInconsistentPlans) {
  Plan plan = make_plan({1, 2}, 1, 2, ScheduleKind::GPipe);
  plan.world_size = 4;
  EXPECT_THROW(partrain::generate_schedule(plan), partrain::Error);
  plan = make_plan({1, 4}, 1, 2, ScheduleKind::GPipe, RecomputePolicy::None, 3);  // 3 samples, 4 replicas
  EXPECT_THROW(partrain::generate_schedule(plan), partrain::Error);
  plan = make_plan({}, 1, 2, ScheduleKind::GPipe);
  EXPECT_THROW(partrain::generate_schedule(plan), partrain::Error);
}

TEST(Schedule, ActionText) {
  EXPECT_EQ(Action::transfer(ActionKind::ReceiveActivation, 3, 2, 0, 4).to_string(),
            "ReceiveActivation(mb 3, from 2, samples [0,4))");
  EXPECT_EQ(Action::forward(1, 0, 2, true).to_string(), "Forward(mb 1, samples [0,2), recomputed)");
  EXPECT_EQ(Action::all_reduce({1, 5}).to_string(), "AllReduce(ranks 1,5)");
  EXPECT_EQ(Action::step().to_string(), "Step");
  EXPECT_THROW(Action::transfer(ActionKind::Forward, 0, 1, 0, 1), partrain::Error);
}

}  // namespace
