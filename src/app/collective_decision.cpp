#include "app/collective_decision.h"

#include "core/error.h"

namespace partrain::app {
namespace {

constexpr const char* kErrorPrefix = "ERROR:";

}  // namespace

std::string decide_on_rank0(comm::Communicator& world, const std::function<std::string()>& decide) {
  std::string text;
  if (world.rank() == 0) {
    try {
      text = decide();
    } catch (const Error& error) {
      text = std::string(kErrorPrefix) + error.message();
    }
  }
  world.broadcast_bytes(text, 0);
  if (text.rfind(kErrorPrefix, 0) == 0) PARTRAIN_FAIL(text.substr(std::string(kErrorPrefix).size()));
  return text;
}

}  // namespace partrain::app
