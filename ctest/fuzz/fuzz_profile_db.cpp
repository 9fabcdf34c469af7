// libFuzzer target: the ProfileDB reader (profile cache JSON). Any input must end in a ProfileDB or
// a partrain::Error, never a crash or another exception.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "profile/profile_db.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json document = nlohmann::json::parse(data, data + size, nullptr, false);
  if (document.is_discarded()) return 0;  // not JSON: io/json_file reports that itself
  try {
    partrain::profile::ProfileDB::from_json(document, "fuzz.json");
  } catch (const partrain::Error&) {
  }
  return 0;
}
