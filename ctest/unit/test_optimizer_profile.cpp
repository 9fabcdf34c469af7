// The optimizer-step measurement that profiling feeds the planner (app/optimizer_profile).
#include <gtest/gtest.h>

#include "app/optimizer_profile.h"
#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"

namespace partrain::app {
namespace {

TEST(OptimizerProfile, MeasuresAPositiveCostPerByteAndRejectsUnknownOptimizers) {
  const runtime::OptimizerSettings settings;
  for (const char* optimizer : {"adamw", "sgd"}) {
    const double seconds = measure_optimizer_seconds_per_byte(cpu_backend(), optimizer, settings, 2);
    EXPECT_GT(seconds, 0.0) << optimizer;
    EXPECT_LT(seconds, 1e-6) << optimizer;  // a byte in under a microsecond on any CPU
  }
  EXPECT_THROW(measure_optimizer_seconds_per_byte(cpu_backend(), "lamb", settings, 1), Error);
}

}  // namespace
}  // namespace partrain::app
