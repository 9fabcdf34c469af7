#pragma once
// Errors that every rank of the job raised alike, after agreeing on them collectively.
#include <sstream>

#include "core/error.h"

namespace partrain {

/// An error every rank of the job raised alike, after agreeing on it collectively (a failed
/// checkpoint write): rank 0 prints it once and every rank ends normally, no MPI_Abort needed.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

}  // namespace partrain

/// Throws partrain::CollectiveError with file:line (call it on every rank with the same message).
#define PARTRAIN_FAIL_COLLECTIVE(message)                                                \
  do {                                                                                  \
    std::ostringstream partrain_check_stream_;                                          \
    partrain_check_stream_ << message;                                                  \
    throw ::partrain::CollectiveError(__FILE__, __LINE__, partrain_check_stream_.str()); \
  } while (0)
