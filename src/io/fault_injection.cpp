#include "io/fault_injection.h"

#include <cstdlib>
#include <exception>

#include "core/error.h"

namespace partrain::io {

int injected_fault_rank(const std::string& fault, std::int64_t step) {
  const char* value = std::getenv(kFaultInjectVariable);
  if (value == nullptr) return -1;
  const std::string text = value;
  const std::string prefix = fault + ":";
  if (text.rfind(prefix, 0) != 0) return -1;
  const std::string rest = text.substr(prefix.size());
  const std::size_t colon = rest.find(':');
  try {
    const int rank = std::stoi(rest.substr(0, colon));
    if (colon != std::string::npos && std::stoll(rest.substr(colon + 1)) != step) return -1;
    return rank;
  } catch (const std::exception&) {
    PARTRAIN_FAIL(kFaultInjectVariable << "=" << text << ": expected " << fault << ":RANK[:STEP]");
  }
}

}  // namespace partrain::io
