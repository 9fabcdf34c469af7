// The ProfileDB's speed calibration (profile/speed_calibration.h): a cache records the calibration it
// was measured with, keeps it through JSON, and rescale_times scales every measured time (forward,
// backward, optimizer step) and the calibration by the same factor, leaving sizes alone. (The
// calibration runs in every profiled training run: the mpi and validation tests.)
#include <gtest/gtest.h>

#include "core/error.h"
#include "profile/profile_db.h"

namespace partrain::profile {
namespace {

TEST(SpeedCalibration, RescaleScalesTimesAndKeepsSizes) {
  ProfileDB db(42, "cpu-1ranks-2threads", "fp32");
  Measurement m;
  m.forward_seconds = 0.010;
  m.backward_seconds = 0.020;
  m.parameter_bytes = 1000;
  m.peak_bytes = 5000;
  const std::vector<int> tasks = {0, 1, 2};
  db.insert(tasks, 4, m);
  db.set_optimizer_seconds_per_byte("adamw", 1e-9);
  db.set_calibration_seconds(0.002);
  db.rescale_times(1.5);
  const Measurement* scaled = db.find(tasks, 4);
  ASSERT_NE(scaled, nullptr);
  EXPECT_DOUBLE_EQ(scaled->forward_seconds, 0.015);
  EXPECT_DOUBLE_EQ(scaled->backward_seconds, 0.030);
  EXPECT_DOUBLE_EQ(scaled->parameter_bytes, 1000);
  EXPECT_DOUBLE_EQ(scaled->peak_bytes, 5000);
  EXPECT_DOUBLE_EQ(db.optimizer_seconds_per_byte().at("adamw"), 1.5e-9);
  EXPECT_DOUBLE_EQ(db.calibration_seconds(), 0.003);
  EXPECT_THROW(db.rescale_times(0), Error);
}

TEST(SpeedCalibration, JsonKeepsTheCalibrationAndOlderCachesHaveNone) {
  ProfileDB db(42, "cpu", "fp32");
  db.set_calibration_seconds(0.0025);
  EXPECT_DOUBLE_EQ(ProfileDB::from_json(db.to_json(), "test").calibration_seconds(), 0.0025);
  nlohmann::json older = db.to_json();
  older.erase("calibration_seconds");
  EXPECT_DOUBLE_EQ(ProfileDB::from_json(older, "older").calibration_seconds(), 0.0);
}

}  // namespace
}  // namespace partrain::profile
