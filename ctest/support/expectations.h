#pragma once
// GoogleTest expectations shared by the op tests.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/gradient_check.h"

namespace partrain::testing {

/// Expects the finite-difference gradient check of one op to pass; prints the checker's report.
inline void expect_gradients(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                             GradientCheckOptions options = {}) {
  const GradientCheckResult result = check_gradients(type, attributes, inputs, options);
  EXPECT_TRUE(result.passed) << result.report;
}

/// Asserts |actual[i] - expected[i]| <= tolerance * (1 + |expected[i]|) for every element.
template <typename Reference>
void expect_near(const std::vector<float>& actual, const std::vector<Reference>& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i)
    ASSERT_NEAR(actual[i], expected[i], tolerance * (1 + std::abs(double(expected[i])))) << "element " << i;
}

}  // namespace partrain::testing
