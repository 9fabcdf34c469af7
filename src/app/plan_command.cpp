// partrain plan: not implemented yet.
#include <cstdio>

#include "app/commands.h"

namespace partrain::app {

int run_plan(const PlanArguments&) {
  std::fprintf(stderr, "partrain plan: not implemented yet\n");
  return 2;
}

}  // namespace partrain::app
