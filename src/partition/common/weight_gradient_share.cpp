#include "partition/common/weight_gradient_share.h"

#include <algorithm>

namespace partrain {

double weight_gradient_share(const Graph& graph, const std::vector<int>& tasks, const std::vector<int>& in_input_half) {
  double weight = 0, backward = 0;
  for (int id : tasks) {
    const Task& task = graph.task(id);
    if (task.constant) continue;
    const double flops = task.cost.forward_flops;
    backward += 2 * flops;
    if (std::binary_search(in_input_half.begin(), in_input_half.end(), id)) continue;
    for (int input : task.inputs)
      if (graph.value(input).kind == ValueKind::Param) {
        weight += flops;
        break;
      }
  }
  return backward > 0 ? weight / backward : 0.0;
}

}  // namespace partrain
