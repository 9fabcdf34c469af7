// The ProfileDB's speed calibration (profile/speed_calibration.h): a cache records the calibration it
// was measured with, keeps it through JSON, and rescale_times scales every measured time (forward,
// backward, optimizer step) and the calibration by the same factor, leaving sizes alone. (The
// calibration runs in every profiled training run: the mpi and validation tests.)
#include <gtest/gtest.h>

#include "core/error.h"
#include "profile/profile_db.h"
#include "profile/speed_calibration.h"
#include "profile/speed_reference.h"
#include <nlohmann/json.hpp>

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

// A run whose layers take 1.5x their cached time plans with times 1.5x the cache's; what it saves
// is at the cache's speed again, a measurement the run added included. Runs whose speed is noisy
// must not move the cache by the product of their noise; within the tolerance nothing is scaled.
TEST(SpeedCalibration, AdaptedRunsKeepTheCacheAtItsOwnSpeed) {
  ProfileDB cache(42, "cpu-2ranks-1threads", "fp32");
  Measurement m;
  m.forward_seconds = 0.010;
  m.backward_seconds = 0.020;
  const std::vector<int> cached = {0, 1}, added = {2};
  cache.insert(cached, 4, m);
  cache.set_calibration_seconds(0.010);

  ProfileDB within = cache;
  EXPECT_DOUBLE_EQ(adapt_to_speed(within, 1.14), 1.0);
  EXPECT_DOUBLE_EQ(within.find(cached, 4)->forward_seconds, 0.010);

  ProfileDB run = cache;
  const double factor = adapt_to_speed(run, 1.5);
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
  EXPECT_DOUBLE_EQ(adapt_to_speed(run, 0.0), 1.0);  // no measurement: nothing scaled
}

// The references a run times again: the longest cached layers within the budget, at most 3, the
// shortest alone when none fits; layers not in the cache never.
TEST(SpeedCalibration, ReferencesAreTheLongestCachedLayersWithinTheBudget) {
  ProfileDB db(42, "cpu-2ranks-1threads", "fp32");
  const auto add = [&](std::vector<int> tasks, std::int64_t batch, double seconds) {
    Measurement m;
    m.forward_seconds = seconds / 3;
    m.backward_seconds = 2 * seconds / 3;
    db.insert(tasks, batch, m);
  };
  add({0, 1}, 1, 0.010);
  add({0, 1}, 2, 0.020);
  add({2, 3}, 1, 0.030);
  add({2, 3}, 2, 0.060);
  add({4}, 1, 0.200);
  const std::vector<ProfileRequest> requests = {{{0, 1}, 1}, {{0, 1}, 2}, {{2, 3}, 1}, {{2, 3}, 2}, {{4}, 1}, {{5}, 1}};
  const std::vector<SpeedReference> chosen = choose_speed_references(db, requests, 0.1);
  ASSERT_EQ(chosen.size(), 3u);  // 0.060 + 0.030 + 0.010 (0.200 and then 0.020 do not fit)
  EXPECT_EQ(chosen[0].tasks, (std::vector<int>{2, 3}));
  EXPECT_EQ(chosen[0].batch, 2);
  EXPECT_NEAR(chosen[0].cached_seconds, 0.060, 1e-15);
  EXPECT_NEAR(chosen[1].cached_seconds, 0.030, 1e-15);
  EXPECT_NEAR(chosen[2].cached_seconds, 0.010, 1e-15);

  const std::vector<SpeedReference> tight = choose_speed_references(db, requests, 0.001);
  ASSERT_EQ(tight.size(), 1u);
  EXPECT_NEAR(tight[0].cached_seconds, 0.010, 1e-15);
  EXPECT_TRUE(choose_speed_references(ProfileDB(42, "cpu", "fp32"), requests).empty());

  const std::vector<SpeedReference> back = speed_references_from_text(speed_references_to_text(chosen));
  ASSERT_EQ(back.size(), chosen.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].tasks, chosen[i].tasks);
    EXPECT_EQ(back[i].batch, chosen[i].batch);
    EXPECT_DOUBLE_EQ(back[i].cached_seconds, chosen[i].cached_seconds);
  }
  EXPECT_TRUE(speed_references_from_text("").empty());
  EXPECT_THROW(speed_references_from_text("0-3;x;0.1\n"), Error);
  EXPECT_THROW(speed_references_from_text("0-3\n"), Error);
}

TEST(SpeedCalibration, JsonKeepsTheCalibrationAndOlderCachesHaveNone) {
  ProfileDB db(42, "cpu", "fp32");
  db.set_calibration_seconds(0.0025);
  db.set_other_load_cores(1.25);
  EXPECT_DOUBLE_EQ(ProfileDB::from_json(db.to_json(), "test").calibration_seconds(), 0.0025);
  EXPECT_DOUBLE_EQ(ProfileDB::from_json(db.to_json(), "test").other_load_cores(), 1.25);
  nlohmann::json older = db.to_json();
  older.erase("calibration_seconds");
  older.erase("other_load_cores");
  EXPECT_DOUBLE_EQ(ProfileDB::from_json(older, "older").calibration_seconds(), 0.0);
  EXPECT_DOUBLE_EQ(ProfileDB::from_json(older, "older").other_load_cores(), -1.0);  // not recorded
}

}  // namespace
}  // namespace partrain::profile
