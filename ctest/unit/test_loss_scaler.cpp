// The dynamic loss scaler's state machine (runtime/loss_scaler.h) against torch.amp.GradScaler's
// update rule worked by hand: growth after growth_interval good steps, back-off on an overflow
// (which restarts the count), the minimum scale, a growth that would overflow, restore, and the
// settings' checks naming the [train] key.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"
#include "runtime/loss_scaler.h"

namespace partrain::runtime {
namespace {

TEST(LossScaler, GrowsAfterTheIntervalAndBacksOffOnOverflow) {
  LossScaler scaler({65536.0, 2.0, 0.5, 3, 0.0});
  EXPECT_EQ(scaler.scale(), 65536.0);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.good_steps(), 2);
  scaler.update(false);  // the third good step in a row: grows, the count restarts
  EXPECT_EQ(scaler.scale(), 131072.0);
  EXPECT_EQ(scaler.good_steps(), 0);
  scaler.update(false);
  scaler.update(false);
  scaler.update(true);  // an overflow halves it and restarts the count
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.good_steps(), 0);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0);  // two good steps since the overflow: not yet
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072.0);
}

TEST(LossScaler, MinimumScaleAndOverflowingGrowth) {
  LossScaler floored({8.0, 2.0, 0.25, 2000, 1.0});
  floored.update(true);
  EXPECT_EQ(floored.scale(), 2.0);
  floored.update(true);
  EXPECT_EQ(floored.scale(), 1.0);  // 0.5 is below min_loss_scale
  floored.update(true);
  EXPECT_EQ(floored.scale(), 1.0);
  LossScaler unfloored({1.0, 2.0, 0.5, 1, 0.0});
  for (int i = 0; i < 10; ++i) unfloored.update(true);
  EXPECT_EQ(unfloored.scale(), std::ldexp(1.0, -10));
  LossScaler huge({std::numeric_limits<double>::max(), 2.0, 0.5, 1, 0.0});
  huge.update(false);  // doubling would be inf: kept
  EXPECT_EQ(huge.scale(), std::numeric_limits<double>::max());
  EXPECT_EQ(huge.good_steps(), 0);
}

TEST(LossScaler, RestoresACheckpointedState) {
  LossScaler scaler({65536.0, 2.0, 0.5, 4, 0.0});
  scaler.restore(1024.0, 3);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.good_steps(), 3);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 2048.0);
  EXPECT_THROW(scaler.restore(0.0, 0), Error);
  EXPECT_THROW(scaler.restore(8.0, -1), Error);
}

void expect_rejected(const LossScalerSettings& settings, const std::string& key) {
  try {
    LossScaler scaler(settings);
    ADD_FAILURE() << key << " was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(key), std::string::npos) << error.what();
  }
}

TEST(LossScaler, RejectsSettingsOutOfRangeNamingTheKey) {
  expect_rejected({-1.0, 2.0, 0.5, 2000, 0.0}, "initial_loss_scale");
  expect_rejected({0.0, 2.0, 0.5, 2000, 0.0}, "initial_loss_scale");
  expect_rejected({65536.0, 1.0, 0.5, 2000, 0.0}, "loss_scale_growth_factor");
  expect_rejected({65536.0, 2.0, 1.0, 2000, 0.0}, "loss_scale_backoff_factor");
  expect_rejected({65536.0, 2.0, 0.0, 2000, 0.0}, "loss_scale_backoff_factor");
  expect_rejected({65536.0, 2.0, 0.5, 0, 0.0}, "loss_scale_growth_interval");
  expect_rejected({65536.0, 2.0, 0.5, 2000, -1.0}, "min_loss_scale");
}

}  // namespace
}  // namespace partrain::runtime
