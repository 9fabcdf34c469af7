#include "runtime/gradient_buckets.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"

namespace partrain::runtime {

std::vector<GradientCompletion> gradient_completion_order(const Graph& graph, const BackwardProgram& program,
                                                          std::span<const int> parameters) {
  std::unordered_map<int, int> last_step;
  for (int parameter : parameters) {
    PARTRAIN_CHECK(last_step.emplace(parameter, -1).second,
                   "gradient buckets: parameter " << graph.value(parameter).name << " listed twice");
  }
  // The same rule as the interpreter's hand-over (graph/interpreter.cpp): a parameter's gradient is
  // complete after the last step that produces a gradient of it.
  for (std::size_t i = 0; i < program.steps.size(); ++i) {
    const BackwardStep& step = program.steps[i];
    const Task& task = graph.task(step.task);
    for (std::size_t k = 0; k < task.inputs.size(); ++k) {
      auto found = last_step.find(task.inputs[k]);
      if (step.input_grad_needed[k] && found != last_step.end()) found->second = static_cast<int>(i);
    }
  }
  // Within its last step, the interpreter hands the gradients over in the order of the task's inputs.
  auto position = [&](const GradientCompletion& completion) {
    if (completion.last_step < 0) return std::size_t{0};
    const std::vector<int>& inputs = graph.task(program.steps[static_cast<std::size_t>(completion.last_step)].task).inputs;
    return static_cast<std::size_t>(std::find(inputs.begin(), inputs.end(), completion.parameter) - inputs.begin());
  };
  std::vector<GradientCompletion> order;
  for (int parameter : parameters) order.push_back({parameter, last_step.at(parameter)});
  std::stable_sort(order.begin(), order.end(), [&](const GradientCompletion& a, const GradientCompletion& b) {
    return a.last_step != b.last_step ? a.last_step < b.last_step : position(a) < position(b);
  });
  return order;
}

std::vector<std::vector<std::size_t>> assign_buckets(std::span<const std::int64_t> bytes, double limit_bytes) {
  PARTRAIN_CHECK(limit_bytes > 0, "gradient buckets: the size limit must be positive, got " << limit_bytes << " bytes");
  std::vector<std::vector<std::size_t>> buckets;
  double filled = 0;  // bytes in the last bucket
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    PARTRAIN_CHECK(bytes[i] >= 0, "gradient buckets: gradient " << i << " has " << bytes[i] << " bytes");
    const double size = static_cast<double>(bytes[i]);
    if (buckets.empty() || filled + size > limit_bytes) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += size;
  }
  return buckets;
}

}  // namespace partrain::runtime
