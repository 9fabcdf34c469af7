#include "core/cuda_ordering.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace partrain {

const char* cuda_ordering_name(CudaOrdering ordering) {
  return ordering == CudaOrdering::Plain ? "plain" : "overlap";
}

CudaOrdering parse_cuda_ordering(std::string_view value, std::string_view source) {
  if (value == "plain") return CudaOrdering::Plain;
  if (value == "overlap") return CudaOrdering::Overlap;
  PARTRAIN_FAIL(source << " = \"" << value << "\" is not a CUDA ordering: use \"overlap\" (the default: "
                       << "collectives overlap compute, device checks once a step) or \"plain\" (one stream, "
                       << "synchronised after every op and collective)");
}

CudaOrdering cuda_ordering_from_environment() {
  // Read once: a value changed during the run must not give two parts of it different orderings.
  static const CudaOrdering ordering = [] {
    const char* value = std::getenv("PARTRAIN_CUDA_ORDERING");
    if (value == nullptr || *value == '\0') return CudaOrdering::Overlap;
    return parse_cuda_ordering(value, "the environment variable PARTRAIN_CUDA_ORDERING");
  }();
  return ordering;
}

}  // namespace partrain
