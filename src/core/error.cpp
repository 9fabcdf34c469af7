#include "core/error.h"

#include <cstring>

namespace partrain {

namespace {
// Keep only the path below the repository root so messages stay short ("src/core/tensor.cpp:12").
const char* short_path(const char* file) {
  for (const char* marker : {"/src/", "/kernels/", "/ctest/"}) {
    if (const char* found = std::strstr(file, marker)) return found + 1;
  }
  return file;
}
}  // namespace

Error::Error(const char* file, int line, const std::string& message)
    : std::runtime_error(std::string(short_path(file)) + ":" + std::to_string(line) + ": " + message),
      message_(message),
      file_(short_path(file)),
      line_(line) {}

}  // namespace partrain
