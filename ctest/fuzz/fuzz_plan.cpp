// libFuzzer target: the plan JSON reader and the plan validator against the tiny BERT graph. Any
// input must end in a plan or a partrain::Error, never a crash or another exception.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/model.h"
#include "plan/plan.h"
#include "support/tiny_models.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const partrain::Graph graph = partrain::build_model(partrain::testing::tiny_model_config("bert"));
  const nlohmann::json document = nlohmann::json::parse(data, data + size, nullptr, false);
  if (document.is_discarded()) return 0;  // not JSON: io/json_file reports that itself
  try {
    const partrain::Plan plan = partrain::Plan::from_json(document, "fuzz.json");
    plan.validate(graph);
  } catch (const partrain::Error&) {
  }
  return 0;
}
