#pragma once
// Capturing the message of a partrain::Error in tests.
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"

namespace partrain::testing {

/// The message of the partrain::Error thrown by `action()`, or "" when none is thrown.
template <typename Action>
std::string error_message(Action&& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.message();
  }
  return "";
}

/// Expects `body()` to throw a partrain::Error whose what() contains `fragment`.
template <typename Body>
void expect_error(Body&& body, const std::string& fragment) {
  try {
    body();
    ADD_FAILURE() << "expected a partrain::Error containing \"" << fragment << "\"";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
        << "message: " << error.what() << "\nexpected to contain: " << fragment;
  }
}

}  // namespace partrain::testing
