// partrain inspect: not implemented yet.
#include <cstdio>

#include "app/commands.h"

namespace partrain::app {

int run_inspect(const InspectArguments&) {
  std::fprintf(stderr, "partrain inspect: not implemented yet\n");
  return 2;
}

}  // namespace partrain::app
