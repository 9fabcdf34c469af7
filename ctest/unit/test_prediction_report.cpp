// The end-of-run comparison of a plan's predictions with what the run measured (app/prediction_report).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "app/prediction_report.h"
#include "core/error.h"

namespace partrain::app {
namespace {

Plan two_stage_plan() {
  Plan plan;
  plan.world_size = 6;
  plan.pipeline_replicas = 2;
  plan.stages.resize(2);
  plan.stages[0].replicas = 2;  // ranks 0, 1 and 3, 4
  plan.stages[0].memory_bytes = 100.0 * (1 << 20);
  plan.stages[1].memory_bytes = 0;  // not predicted
  plan.predicted_step_seconds = 0.5;
  return plan;
}

TEST(PredictionReport, TypicalStepIsTheMedianAfterTheFirst) {
  EXPECT_DOUBLE_EQ(typical_step_seconds({}), 0.0);
  EXPECT_DOUBLE_EQ(typical_step_seconds({9.0}), 9.0);
  EXPECT_DOUBLE_EQ(typical_step_seconds({9.0, 1.0, 3.0, 2.0}), 2.0);        // 1, 2, 3
  EXPECT_DOUBLE_EQ(typical_step_seconds({9.0, 4.0, 1.0, 3.0, 2.0}), 2.5);   // 1, 2, 3, 4
}

TEST(PredictionReport, StagePeaksAreTheLargestOverTheStagesRanks) {
  const Plan plan = two_stage_plan();
  EXPECT_EQ(stage_peak_bytes(plan, {1, 5, 2, 3, 4, 7}), (std::vector<double>{5, 7}));
  EXPECT_THROW(stage_peak_bytes(plan, {1, 2}), Error);
}

TEST(PredictionReport, LineGivesSignedRelativeErrors) {
  const Plan plan = two_stage_plan();
  const std::string line = prediction_error_line(plan, {3.0, 0.6, 0.55, 0.65}, {90.0 * (1 << 20), 1.0 * (1 << 20)});
  EXPECT_EQ(line,
            "prediction error: step time +20.0% (measured 0.6000 s, median of 3 steps; predicted 0.5000 s); peak memory "
            "per stage: 0 -10.0% (90.0 of 100.0 MiB predicted), 1 not predicted (1.0 of 0.0 MiB predicted)");
}

TEST(PredictionReport, AnalyticPlansSayTheirStepTimeIsForAnotherDevice) {
  Plan plan = two_stage_plan();
  plan.cost_model = "analytic (1 TFLOP/s, 16 GiB per device)";
  const std::string line = prediction_error_line(plan, {3.0, 0.6, 0.55, 0.65}, {90.0 * (1 << 20), 1.0 * (1 << 20)});
  EXPECT_EQ(line,
            "prediction: step time 0.5000 s for the analytic cost model's nominal device, not this machine (measured "
            "0.6000 s, median of 3 steps; [profile] enabled = true measures this machine); peak memory per stage: 0 "
            "-10.0% (90.0 of 100.0 MiB predicted), 1 not predicted (1.0 of 0.0 MiB predicted)");
  EXPECT_EQ(line.find("error"), std::string::npos);
}

}  // namespace
}  // namespace partrain::app
