// Re-planning's arithmetic (app/replanning.h): stage costs read from an executor's trace, the
// measured / predicted factors, and the ProfileDB corrected at the microbatch size the stage ran and below;
// task-set keys parse back to their tasks. The whole path runs in ctest/validation/replanning.cpp.
#include <gtest/gtest.h>

#include "app/replanning.h"
#include "core/error.h"

namespace partrain {
namespace {

// Two stages of one replica each on 2 ranks, 4 microbatches of 4 samples; stage 0 tasks 0-3, stage 1 tasks 4-6.
Plan two_stages() {
  Plan plan;
  plan.world_size = 2;
  plan.global_batch = 16;
  plan.microbatches = 4;
  plan.stages.resize(2);
  plan.stages[0].tasks = {0, 1, 2, 3};
  plan.stages[0].forward_seconds = 0.010;
  plan.stages[0].backward_seconds = 0.020;
  plan.stages[1].tasks = {4, 5, 6};
  plan.stages[1].forward_seconds = 0.030;
  plan.stages[1].backward_seconds = 0.040;
  return plan;
}

TEST(Replanning, TaskSetKeysParseBack) {
  EXPECT_EQ(profile::parse_task_set_key("0-3,7,9-10"), (std::vector<int>{0, 1, 2, 3, 7, 9, 10}));
  const std::vector<int> tasks = {5, 1, 2, 3, 9};
  EXPECT_EQ(profile::parse_task_set_key(profile::task_set_key(tasks)), (std::vector<int>{1, 2, 3, 5, 9}));
  for (const char* bad : {"", "a", "3-1", "1-", "1,,2", "2x"}) EXPECT_THROW(profile::parse_task_set_key(bad), Error) << bad;
}

TEST(Replanning, StageCostsAreMediansOfTheWindowsActions) {
  const Plan plan = two_stages();
  std::vector<io::TraceEvent> trace;
  // Step 0 (outside the window) is slow; steps 1-2 are counted. Rank 1 holds stage 1.
  for (std::int64_t step = 0; step < 3; ++step) {
    const double scale = step == 0 ? 10.0 : 1.0;
    for (int mb = 0; mb < 4; ++mb) {
      trace.push_back({"Forward mb " + std::to_string(mb), "compute", 0, scale * (30000 + 1000 * mb), step});
      trace.push_back({"Recompute mb " + std::to_string(mb), "compute", 0, scale * 30000, step});
      trace.push_back({"Backward mb " + std::to_string(mb), "compute", 0, scale * 50000, step});
      trace.push_back({"SendGradient mb " + std::to_string(mb), "communication", 0, 99999, step});
    }
    trace.push_back({"Step", "optimizer", 0, 99999, step});
  }
  const std::map<int, app::MeasuredStageCosts> costs = app::measured_stage_costs(trace, plan, 1, 1, 3);
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_DOUBLE_EQ(costs.at(1).forward_seconds, 0.0315);          // median of 30, 31, 32, 33 ms (twice)
  EXPECT_DOUBLE_EQ(costs.at(1).backward_seconds, 0.030 + 0.050);  // the recomputed forward counts in the backward

  const std::map<int, profile::TimeCorrection> corrections = app::stage_corrections(plan, costs);
  EXPECT_DOUBLE_EQ(corrections.at(1).forward, 0.0315 / 0.030);
  EXPECT_DOUBLE_EQ(corrections.at(1).backward, 0.080 / 0.040);
}

// Ranks sharing a core: the trace shows each action's work stretched by the rank computing beside it.
// A run that measures exactly the simulated durations needs no correction, though they exceed the
// stages' work; the plan's own costs where every rank has a core.
TEST(Replanning, RanksSharingCoresAreComparedWithTheSimulatedDurations) {
  Plan plan = two_stages();
  const std::map<int, app::MeasuredStageCosts> own = app::predicted_stage_costs(plan);
  EXPECT_DOUBLE_EQ(own.at(1).forward_seconds, 0.030);
  EXPECT_DOUBLE_EQ(own.at(1).backward_seconds, 0.040);
  plan.ranks_per_node = 2;
  plan.concurrent_ranks_per_node = 1;
  const std::map<int, app::MeasuredStageCosts> shared = app::predicted_stage_costs(plan);
  ASSERT_EQ(shared.size(), 2u);
  for (int s : {0, 1}) {
    const PlanStage& stage = plan.stages[static_cast<std::size_t>(s)];
    EXPECT_GE(shared.at(s).forward_seconds, stage.forward_seconds - 1e-12) << s;
    EXPECT_LE(shared.at(s).forward_seconds, 2 * stage.forward_seconds + 1e-12) << s;
    EXPECT_GE(shared.at(s).backward_seconds, stage.backward_seconds - 1e-12) << s;
    EXPECT_LE(shared.at(s).backward_seconds, 2 * stage.backward_seconds + 1e-12) << s;
  }
  // 1F1B: stage 0's forwards after the first and its backwards run beside stage 1's work, at half
  // speed; stage 1's backwards run while stage 0 waits for their gradients, at full speed.
  EXPECT_NEAR(shared.at(0).forward_seconds, 2 * 0.010, 1e-12);
  EXPECT_NEAR(shared.at(0).backward_seconds, 2 * 0.020, 1e-12);
  EXPECT_NEAR(shared.at(1).backward_seconds, 0.040, 1e-12);
  for (const auto& [stage, correction] : app::stage_corrections(plan, shared)) {
    EXPECT_NEAR(correction.forward, 1.0, 1e-12) << stage;
    EXPECT_NEAR(correction.backward, 1.0, 1e-12) << stage;
  }
}

TEST(Replanning, TheProfileIsCorrectedAtTheMicrobatchSizeThatRan) {
  const Plan plan = two_stages();  // microbatches of 4 samples on one replica
  profile::ProfileDB database(1, "cpu", "fp32");
  profile::Measurement m;
  m.forward_seconds = 1.0;
  m.backward_seconds = 2.0;
  const std::vector<int> first = {0, 1}, second = {2, 3}, last = {4, 5, 6}, elsewhere = {7};
  for (std::int64_t batch : {1, 2, 4, 8})
    for (const auto* tasks : {&first, &second, &last, &elsewhere}) database.insert(*tasks, batch, m);
  database.insert(last, 3, m);  // a size below the one that ran
  app::correct_profile(database, plan, {{0, {2.0, 3.0}}, {1, {0.5, 0.25}}});
  for (std::int64_t batch : {1, 2, 3, 4, 8}) {
    const bool ran = batch <= 4;  // the size that ran and the smaller ones
    for (const auto* tasks : {&first, &second}) {
      if (batch == 3) continue;  // not measured for these sets
      EXPECT_DOUBLE_EQ(database.find(*tasks, batch)->forward_seconds, ran ? 2.0 : 1.0) << batch;
      EXPECT_DOUBLE_EQ(database.find(*tasks, batch)->backward_seconds, ran ? 6.0 : 2.0) << batch;
    }
    EXPECT_DOUBLE_EQ(database.find(last, batch)->forward_seconds, ran ? 0.5 : 1.0) << batch;
    EXPECT_DOUBLE_EQ(database.find(last, batch)->backward_seconds, ran ? 0.5 : 2.0) << batch;
    if (batch != 3) EXPECT_DOUBLE_EQ(database.find(elsewhere, batch)->forward_seconds, 1.0) << batch;
  }

  // A size that was not profiled itself (3 samples): the profiled size above it and the smaller ones.
  Plan odd = two_stages();
  odd.global_batch = 12;  // 4 microbatches of 3 samples
  profile::ProfileDB sparse(1, "cpu", "fp32");
  for (std::int64_t batch : {1, 2, 4, 8}) sparse.insert(first, batch, m);
  app::correct_profile(sparse, odd, {{0, {2.0, 2.0}}});
  EXPECT_DOUBLE_EQ(sparse.find(first, 1)->forward_seconds, 2.0);
  EXPECT_DOUBLE_EQ(sparse.find(first, 2)->forward_seconds, 2.0);
  EXPECT_DOUBLE_EQ(sparse.find(first, 4)->forward_seconds, 2.0);
  EXPECT_DOUBLE_EQ(sparse.find(first, 8)->forward_seconds, 1.0);
  EXPECT_THROW(app::correct_profile(sparse, odd, {{0, {0.0, 1.0}}}), Error);
}

TEST(Replanning, ASwitchNeedsAnotherLayoutPredictedClearlyFaster) {
  const Plan current = two_stages();
  Plan candidate = current;
  candidate.predicted_step_seconds = 0.5;
  EXPECT_TRUE(app::same_layout(candidate, current));  // predictions alone do not make another plan
  candidate.microbatches = 8;
  EXPECT_FALSE(app::same_layout(candidate, current));
  EXPECT_TRUE(app::faster_plan(candidate, 1.0));
  EXPECT_FALSE(app::faster_plan(candidate, 0.52));  // 4% faster than measured: not worth a switch
  candidate.predicted_step_seconds = 0;
  EXPECT_FALSE(app::faster_plan(candidate, 1.0));
}

}  // namespace
}  // namespace partrain
