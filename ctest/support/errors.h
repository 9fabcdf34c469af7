#pragma once
// Capturing the message of a partrain::Error in tests.
#include <string>

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

}  // namespace partrain::testing
