// partrain train: not implemented yet.
#include <cstdio>

#include "app/commands.h"

namespace partrain::app {

int run_train(const TrainArguments&) {
  std::fprintf(stderr, "partrain train: not implemented yet\n");
  return 2;
}

}  // namespace partrain::app
