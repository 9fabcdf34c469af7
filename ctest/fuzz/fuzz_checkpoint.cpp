// libFuzzer target: the HDF5 checkpoint reader (summary and full read with checksums). Any input
// must end in a checkpoint or a partrain::Error, never a crash or another exception.
#include <cstdint>

#include "core/error.h"
#include "fuzz/fuzz_input_file.h"
#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = partrain::fuzz::write_input(data, size, "h5");
  try {
    partrain::io::read_checkpoint(path);
  } catch (const partrain::Error&) {
  }
  return 0;
}
