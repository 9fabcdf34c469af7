// libFuzzer target: the TOML experiment-file reader. Any input must end in a value or a
// partrain::Error (a clear message), never a crash, a hang or another exception.
#include <cstdint>

#include "core/error.h"
#include "fuzz/fuzz_input_file.h"
#include "io/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = partrain::fuzz::write_input(data, size, "toml");
  try {
    partrain::load_experiment(path);
  } catch (const partrain::Error&) {
  }
  return 0;
}
