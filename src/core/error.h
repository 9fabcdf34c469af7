#pragma once
// Errors with file:line. Every user-facing failure in partrain is a partrain::Error whose message
// names where it was raised; app/main.cpp prints it and exits without a backtrace.
#include <sstream>
#include <stdexcept>
#include <string>

namespace partrain {

/// An error raised by a failed check. what() reads "file:line: message".
class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& message);
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

}  // namespace partrain

/// Throws partrain::Error with file:line when `condition` is false. `message` is a stream
/// expression: PARTRAIN_CHECK(a == b, "shape " << a << " != " << b).
#define PARTRAIN_CHECK(condition, message)                                          \
  do {                                                                              \
    if (!(condition)) {                                                             \
      std::ostringstream partrain_check_stream_;                                    \
      partrain_check_stream_ << message;                                            \
      throw ::partrain::Error(__FILE__, __LINE__, partrain_check_stream_.str());    \
    }                                                                               \
  } while (0)

/// Throws partrain::Error with file:line unconditionally.
#define PARTRAIN_FAIL(message) PARTRAIN_CHECK(false, message)
