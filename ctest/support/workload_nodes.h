#pragma once
// Hand-made workload nodes for the tests of the ideal DP and the integer programs.
#include <string>

#include "partition/tarnawski/workload.h"

namespace partrain::testing {

/// A node of colour class `color` named fw<color> or bw<color> (backward), as workload files name them.
inline partition::WorkloadNode make_node(long id, bool backward, long color) {
  partition::WorkloadNode node;
  node.id = id;
  node.name = (backward ? "bw" : "fw") + std::to_string(color);
  node.backward = backward;
  node.has_color_class = true;
  node.color_class = color;
  return node;
}

}  // namespace partrain::testing
