// The CUDA ordering switch (core/cuda_ordering.h): parsing, the error for a bad value, and the
// environment variable read once.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/cuda_ordering.h"
#include "core/error.h"

namespace partrain {
namespace {

TEST(CudaOrdering, ParsesBothNamesAndRoundTrips) {
  EXPECT_EQ(parse_cuda_ordering("plain", "test"), CudaOrdering::Plain);
  EXPECT_EQ(parse_cuda_ordering("overlap", "test"), CudaOrdering::Overlap);
  for (CudaOrdering ordering : {CudaOrdering::Plain, CudaOrdering::Overlap})
    EXPECT_EQ(parse_cuda_ordering(cuda_ordering_name(ordering), "test"), ordering);
}

TEST(CudaOrdering, RejectsOtherValuesNamingTheSettingAndTheValue) {
  for (const char* bad : {"", "Plain", "sync", "overlap "}) {
    try {
      parse_cuda_ordering(bad, "[train] cuda_ordering");
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const Error& error) {
      const std::string message = error.message();
      EXPECT_NE(message.find("[train] cuda_ordering"), std::string::npos) << message;
      EXPECT_NE(message.find(std::string("\"") + bad + "\""), std::string::npos) << message;
      EXPECT_NE(message.find("plain"), std::string::npos) << message;
      EXPECT_NE(message.find("overlap"), std::string::npos) << message;
    }
  }
}

// The only test of this binary that reads the environment (the value is cached per process).
TEST(CudaOrdering, EnvironmentIsReadOnce) {
  ASSERT_EQ(setenv("PARTRAIN_CUDA_ORDERING", "plain", 1), 0);
  EXPECT_EQ(cuda_ordering_from_environment(), CudaOrdering::Plain);
  ASSERT_EQ(setenv("PARTRAIN_CUDA_ORDERING", "overlap", 1), 0);
  EXPECT_EQ(cuda_ordering_from_environment(), CudaOrdering::Plain);
  unsetenv("PARTRAIN_CUDA_ORDERING");
}

}  // namespace
}  // namespace partrain
