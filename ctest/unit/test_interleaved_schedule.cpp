// Unit tests of Megatron-LM's interleaved 1F1B schedule (Narayanan et al. SC'21 §2.2): the plan's
// chunk layout, every generated list passes the deadlock checker over a grid of plans, the order of
// forward and backward chunk steps matches Megatron's, the checker rejects a list that waits for a
// chunk's activation before it was sent, and the simulated bubble shrinks by v as the closed form
// (S − 1) / (v · M) says.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/schedule.h"
#include "plan/schedule_checker.h"
#include "plan/schedule_simulator.h"
#include "plan/schedule_topology.h"
#include "support/errors.h"

namespace {

using partrain::Action;
using partrain::ActionKind;
using partrain::Plan;
using partrain::RecomputePolicy;
using partrain::Schedule;
using partrain::ScheduleKind;

/// A plan without a graph: S pipeline stages of `replicas` each, v model chunks per stage (S·v
/// stages entries), `copies` pipeline replicas, M microbatches of `microbatch_size` samples.
Plan interleaved_plan(int S, int v, int M, int replicas = 1, int copies = 1,
                      RecomputePolicy recompute = RecomputePolicy::None, int microbatch_size = 6) {
  Plan plan;
  plan.planner = "test";
  plan.pipeline_replicas = copies;
  plan.microbatches = M;
  plan.global_batch = static_cast<std::int64_t>(copies) * M * microbatch_size;
  plan.schedule = ScheduleKind::Interleaved;
  plan.virtual_stages = v;
  for (int c = 0; c < S * v; ++c) {
    partrain::PlanStage stage;
    stage.tasks = {c};
    stage.replicas = replicas;
    stage.recompute = recompute;
    plan.stages.push_back(stage);
  }
  plan.world_size = copies * S * replicas;
  return plan;
}

std::string error_of(const Plan& plan, const Schedule& schedule) {
  return partrain::testing::error_message([&] { partrain::check_schedule(plan, schedule); });
}

/// "F0.1 B0.1 ..." : forward / backward of microbatch 0 on local chunk 1.
std::string compute_order(const std::vector<Action>& list) {
  std::string order;
  for (const Action& a : list)
    if (a.kind == ActionKind::Forward || a.kind == ActionKind::Backward)
      order += (a.kind == ActionKind::Forward ? "F" : "B") + std::to_string(a.microbatch) + "." +
               std::to_string(a.chunk) + " ";
  return order;
}

TEST(InterleavedSchedule, PlanPlacesChunkCOnStageCModS) {
  const Plan plan = interleaved_plan(4, 2, 8, 2);
  EXPECT_EQ(plan.pipeline_stages(), 4);
  EXPECT_EQ(plan.devices_per_pipeline_replica(), 8);
  EXPECT_EQ(plan.chunks_of_stage(1), (std::vector<int>{1, 5}));
  EXPECT_EQ(plan.stage_of_chunk(6), 2);
  for (int rank = 0; rank < plan.world_size; ++rank) EXPECT_EQ(plan.rank_of(plan.placement_of(rank)), rank);
  EXPECT_EQ(plan.placement_of(7).stage, 3);
  EXPECT_EQ(partrain::global_chunk(plan, 7, 1), 7);
  EXPECT_EQ(partrain::global_chunk(plan, 0, 1), 4);
}

TEST(InterleavedSchedule, InconsistentPlansAreRejected) {
  auto message = [](const Plan& plan) { return partrain::testing::error_message([&] { plan.validate_interleaving(); }); };
  Plan plan = interleaved_plan(2, 2, 4);
  EXPECT_EQ(message(plan), "");
  Plan odd = plan;
  odd.microbatches = 3;
  EXPECT_NE(message(odd).find("multiple of the pipeline depth (2)"), std::string::npos) << message(odd);
  Plan chunks = plan;
  chunks.stages.pop_back();
  EXPECT_NE(message(chunks).find("do not divide into 2 virtual stages"), std::string::npos) << message(chunks);
  Plan replicas = plan;
  replicas.stages[2].replicas = 2;
  EXPECT_NE(message(replicas).find("model chunk 2 has 2 replicas"), std::string::npos) << message(replicas);
  Plan other = plan;
  other.schedule = ScheduleKind::OneForwardOneBackward;
  EXPECT_NE(message(other).find("needs the interleaved or zb_v schedule"), std::string::npos) << message(other);
  Plan one_stage = interleaved_plan(1, 2, 2);
  EXPECT_NE(message(one_stage).find("at least 2 pipeline stages"), std::string::npos) << message(one_stage);
  // The generator refuses them too.
  EXPECT_NE(partrain::testing::error_message([&] { partrain::generate_schedule(odd); }).find("multiple"), std::string::npos);
}

TEST(InterleavedSchedule, EveryGeneratedScheduleIsCompleteAndDeadlockFree) {
  int checked = 0;
  for (int S = 2; S <= 4; ++S)
    for (int v = 1; v <= 3; ++v)
      for (int M = S; M <= 3 * S; M += S)
        for (int replicas = 1; replicas <= 2; ++replicas)
          for (int copies = 1; copies <= 2; ++copies)
            for (RecomputePolicy policy : {RecomputePolicy::None, RecomputePolicy::StageBoundaries}) {
              const Plan plan = interleaved_plan(S, v, M, replicas, copies, policy, replicas == 2 ? 5 : 6);
              const Schedule schedule = partrain::generate_schedule(plan);
              ASSERT_EQ(static_cast<int>(schedule.size()), plan.world_size);
              EXPECT_EQ(error_of(plan, schedule), "") << "S " << S << " v " << v << " M " << M << " replicas "
                                                      << replicas << " copies " << copies;
              ++checked;
            }
  EXPECT_EQ(checked, 3 * 3 * 3 * 2 * 2 * 2);
}

TEST(InterleavedSchedule, VirtualStagesOneIsOneForwardOneBackward) {
  Plan interleaved = interleaved_plan(3, 1, 6);
  Plan plain = interleaved;
  plain.schedule = ScheduleKind::OneForwardOneBackward;
  EXPECT_EQ(partrain::generate_schedule(interleaved), partrain::generate_schedule(plain));
}

TEST(InterleavedSchedule, MegatronOrder) {
  // S = 2, v = 2, M = 4: stage 0 warms up with (S − 0 − 1)·2 + (v − 1)·S = 4 forward chunk steps,
  // stage 1 with 2; groups of S = 2 microbatches go through chunk 0, then chunk 1 (backward: chunk 1
  // first).
  const Plan plan = interleaved_plan(2, 2, 4);
  const Schedule schedule = partrain::generate_schedule(plan);
  EXPECT_EQ(compute_order(schedule[0]), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0 ");
  EXPECT_EQ(compute_order(schedule[1]), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0 ");
  // The last chunk of stage 1 (model chunk 1) sends to chunk 1 of stage 0 (model chunk 2): the wrap.
  const std::vector<Action>& last = schedule[1];
  const auto send = std::find_if(last.begin(), last.end(), [](const Action& a) {
    return a.kind == ActionKind::SendActivation && a.chunk == 0;
  });
  ASSERT_NE(send, last.end());
  EXPECT_EQ(send->peer, 0);
  EXPECT_EQ(partrain::receiver_chunk(plan, 1, *send), 2);
  EXPECT_EQ(send->to_string(), "SendActivation(mb 0, to 0, samples [0,6))");
  const auto receive = std::find_if(schedule[0].begin(), schedule[0].end(), [](const Action& a) {
    return a.kind == ActionKind::ReceiveActivation;
  });
  ASSERT_NE(receive, schedule[0].end());
  EXPECT_EQ(receive->to_string(), "ReceiveActivation(mb 0, chunk 1, from 1, samples [0,6))");
  // One all-reduce-free Step per rank (no replicas), last.
  EXPECT_EQ(last.back(), Action::step());
}

// A rank's activation peak walks its list (Plan::rank_peak_bytes): with MegatronOrder's lists and a
// second chunk holding 100 times the first's bytes per microbatch, stage 1's peak holds one
// microbatch of chunk 1 (its forwards go straight to their backwards) and two of chunk 0, plus chunk
// 1's working memory: 2·10 + 1000 + 100. Stage 0 holds two of each before B0.1 frees one of chunk 1:
// 3·10 + 2·1000 + 100. Counting each chunk's (warm-up + 1) / v microbatches would say 2121 for both.
TEST(InterleavedSchedule, PeakActivationBytesWalksTheList) {
  const Schedule schedule = partrain::generate_schedule(interleaved_plan(2, 2, 4));
  const std::vector<double> microbatch_bytes = {10, 1000}, working_bytes = {1, 100};
  EXPECT_DOUBLE_EQ(partrain::peak_activation_bytes(schedule[1], microbatch_bytes, working_bytes), 1120);
  EXPECT_DOUBLE_EQ(partrain::peak_activation_bytes(schedule[0], microbatch_bytes, working_bytes), 2130);
  // The same from the stage's compute order alone (what the planner's search walks), and through
  // the undominated states: stage 1 passes through few distinct ones.
  const std::vector<partrain::Action> order = partrain::interleaved_compute_order(2, 2, 4, 1);
  EXPECT_EQ(compute_order(order), compute_order(schedule[1]));
  const std::vector<partrain::InFlightState> states = partrain::in_flight_states(order, 2);
  EXPECT_LE(states.size(), 4u);
  EXPECT_DOUBLE_EQ(partrain::peak_activation_bytes(states, microbatch_bytes, working_bytes), 1120);
  // One chunk's figures for a list of two chunks: an error naming what is missing.
  const std::vector<double> one = {10};
  EXPECT_NE(partrain::testing::error_message([&] { partrain::peak_activation_bytes(schedule[0], one, one); })
                .find("chunks up to 1, figures for 1"),
            std::string::npos);
}

TEST(InterleavedSchedule, CheckerReportsDeadlockOnChunkOrder) {
  // Stage 0 runs chunk 1's forward of microbatch 0 before chunk 0's: it waits for stage 1, which
  // waits for chunk 0's activation that stage 0 never sent yet.
  const Plan plan = interleaved_plan(2, 2, 2);
  Schedule schedule = partrain::generate_schedule(plan);
  std::vector<Action>& first = schedule[0];
  auto is_forward_chunk = [](int chunk) {
    return [chunk](const Action& a) { return a.microbatch == 0 && a.chunk == chunk && a.kind != ActionKind::Backward &&
                                              a.kind != ActionKind::SendGradient && a.kind != ActionKind::ReceiveGradient; };
  };
  // Move chunk 1's receive + forward + send of microbatch 0 to the front.
  std::vector<Action> moved, rest;
  for (const Action& a : first) (is_forward_chunk(1)(a) ? moved : rest).push_back(a);
  moved.insert(moved.end(), rest.begin(), rest.end());
  first = moved;
  const std::string error = error_of(plan, schedule);
  EXPECT_NE(error.find("schedule deadlocks (interleaved)"), std::string::npos) << error;
  EXPECT_NE(error.find("ReceiveActivation(mb 0, chunk 1, from 1"), std::string::npos) << error;
}

TEST(InterleavedSchedule, BubbleShrinksByVirtualStages) {
  // S = 4, M = 8, forward 1 and backward 2 per stage split evenly over its v chunks, free transfers.
  // Narayanan et al. §2.2: bubble time / ideal time = (S − 1) / (v · M); the simulator's fraction
  // of the pipeline phase is that over 1 + that.
  const int S = 4, M = 8;
  std::vector<double> fraction;
  for (int v : {1, 2, 4}) {
    const Plan plan = interleaved_plan(S, v, M);
    partrain::TimelineCosts costs;
    costs.forward_seconds.assign(S * v, 1.0 / v);
    costs.backward_seconds.assign(S * v, 2.0 / v);
    costs.recompute_seconds.assign(S * v, 0.0);
    const auto prediction = partrain::simulate_schedule(plan, partrain::generate_schedule(plan), costs);
    const double ratio = static_cast<double>(S - 1) / (v * M);
    EXPECT_NEAR(prediction.bubble_fraction / (1 - prediction.bubble_fraction), ratio, 0.1 * ratio) << "v " << v;
    for (double busy : prediction.rank_compute_seconds) EXPECT_NEAR(busy, 3.0 * M, 1e-9);
    fraction.push_back(prediction.bubble_fraction);
  }
  EXPECT_NEAR(fraction[0], 3.0 / 11.0, 1e-9);  // 1F1B: (S − 1) / (M + S − 1)
  EXPECT_LT(fraction[1], 0.65 * fraction[0]);   // v = 2: 3/19 ≈ 0.158 against 3/11 ≈ 0.273
  EXPECT_LT(fraction[2], fraction[1]);
}

TEST(InterleavedSchedule, AllReduceAndStepChargeEveryChunkOfTheRank) {
  const Plan plan = interleaved_plan(2, 2, 2, 2);
  partrain::TimelineCosts costs;
  costs.forward_seconds.assign(4, 0.0);
  costs.backward_seconds.assign(4, 0.0);
  costs.recompute_seconds.assign(4, 0.0);
  costs.stage_step_seconds = {1.0, 2.0, 3.0, 4.0};
  costs.all_reduce_seconds = [](int chunk) { return 10.0 * (chunk + 1); };
  const auto prediction = partrain::simulate_schedule(plan, partrain::generate_schedule(plan), costs);
  // Stage 0 holds chunks 0 and 2: all-reduce 10 + 30, step 1 + 3; stage 1 chunks 1, 3: 20 + 40, 2 + 4.
  EXPECT_DOUBLE_EQ(prediction.step_seconds, 66.0);
}

}  // namespace
