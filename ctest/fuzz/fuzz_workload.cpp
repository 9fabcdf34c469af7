// libFuzzer target: the workload JSON reader of `partrain plan --workload` (Tarnawski et al.'s
// format). Any input must end in a workload or a partrain::Error, never a crash, undefined
// behaviour (UBSan) or another exception.
#include <cstdint>

#include "core/error.h"
#include "fuzz/fuzz_input_file.h"
#include "partition/tarnawski/workload.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = partrain::fuzz::write_input(data, size, "json");
  try {
    partrain::partition::read_workload(path);
  } catch (const partrain::Error&) {
  }
  return 0;
}
