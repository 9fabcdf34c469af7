// The ProfileDB's speed calibration (profile/speed_calibration.h): a cache records the calibration it
// was measured with, keeps it through JSON, and rescale_times scales every measured time (forward,
// backward, optimizer step) and the calibration by the same factor, leaving sizes alone. (The
// calibration runs in every profiled training run: the mpi and validation tests.)
#include <gtest/gtest.h>

#include "core/error.h"
#include "profile/profile_db.h"
#include "profile/speed_calibration.h"

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

// A run whose calibration is 1.5x the cache's plans with times 1.5x the cache's; what it saves is
// at the cache's speed again, a measurement the run added included. Runs with noisy calibrations
// (this VM: 10.4-10.9 ms or 13.8-20 ms per process) must not move the cache by the product of their
// noise; within the tolerance nothing is scaled.
TEST(SpeedCalibration, AdaptedRunsKeepTheCacheAtItsOwnSpeed) {
  ProfileDB cache(42, "cpu-2ranks-1threads", "fp32");
  Measurement m;
  m.forward_seconds = 0.010;
  m.backward_seconds = 0.020;
  const std::vector<int> cached = {0, 1}, added = {2};
  cache.insert(cached, 4, m);
  cache.set_calibration_seconds(0.010);

  ProfileDB within = cache;
  EXPECT_DOUBLE_EQ(adapt_to_speed(within, 0.0114), 1.0);
  EXPECT_DOUBLE_EQ(within.find(cached, 4)->forward_seconds, 0.010);

  ProfileDB run = cache;
  const double factor = adapt_to_speed(run, 0.015);
  EXPECT_DOUBLE_EQ(factor, 1.5);
  EXPECT_DOUBLE_EQ(run.find(cached, 4)->forward_seconds, 0.015);
  Measurement measured_now;  // taken at the run's speed
  measured_now.forward_seconds = 0.003;
  measured_now.backward_seconds = 0.006;
  run.insert(added, 4, measured_now);

  const ProfileDB saved = at_recorded_speed(run, factor);
  EXPECT_NEAR(saved.calibration_seconds(), 0.010, 1e-15);
  EXPECT_NEAR(saved.find(cached, 4)->forward_seconds, 0.010, 1e-15);
  EXPECT_NEAR(saved.find(cached, 4)->backward_seconds, 0.020, 1e-15);
  EXPECT_NEAR(saved.find(added, 4)->forward_seconds, 0.002, 1e-15);
  EXPECT_NEAR(saved.find(added, 4)->backward_seconds, 0.004, 1e-15);

  // A second noisy run adapts from the saved cache, not from the first run's view.
  ProfileDB second = saved;
  EXPECT_NEAR(adapt_to_speed(second, 0.010), 1.0, 1e-12);
  EXPECT_NEAR(second.find(cached, 4)->forward_seconds, 0.010, 1e-15);

  ProfileDB older = cache;  // no calibration recorded: used as it is
  older.set_calibration_seconds(0);
  EXPECT_DOUBLE_EQ(adapt_to_speed(older, 0.015), 1.0);
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
