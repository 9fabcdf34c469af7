#include "graph/autodiff.h"

#include <algorithm>
#include <unordered_set>

namespace partrain {

BackwardProgram build_backward(const Graph& graph, const Subgraph& subgraph) {
  // Forward sweep: which values depend differentiably on a parameter or a boundary activation.
  std::unordered_set<int> requires_grad;
  for (int v : subgraph.inputs) {
    const ValueKind kind = graph.value(v).kind;
    if ((kind == ValueKind::Param || kind == ValueKind::Activation) && is_floating(graph.value(v).type.dtype))
      requires_grad.insert(v);
  }
  for (int t : subgraph.tasks) {
    const Task& task = graph.task(t);
    const OpSchema& schema = op_schema(task.op);
    bool any = false;
    for (std::size_t i = 0; i < task.inputs.size(); ++i)
      any = any || (schema.input_is_differentiable(i) && requires_grad.count(task.inputs[i]));
    if (any)
      for (int output : task.outputs)
        if (is_floating(graph.value(output).type.dtype)) requires_grad.insert(output);
  }

  // Backward sweep: which values actually receive a gradient, starting from the subgraph outputs.
  BackwardProgram program;
  std::unordered_set<int> receives_grad;
  for (int v : subgraph.outputs)
    if (requires_grad.count(v)) {
      receives_grad.insert(v);
      program.output_grads.push_back(v);
    }
  for (auto it = subgraph.tasks.rbegin(); it != subgraph.tasks.rend(); ++it) {
    const Task& task = graph.task(*it);
    const bool reached = std::any_of(task.outputs.begin(), task.outputs.end(),
                                     [&](int output) { return receives_grad.count(output) != 0; });
    if (!reached) continue;
    const OpSchema& schema = op_schema(task.op);
    BackwardStep step;
    step.task = task.id;
    step.input_grad_needed.resize(task.inputs.size(), false);
    bool any = false;
    for (std::size_t i = 0; i < task.inputs.size(); ++i) {
      if (schema.input_is_differentiable(i) && requires_grad.count(task.inputs[i])) {
        step.input_grad_needed[i] = true;
        receives_grad.insert(task.inputs[i]);
        any = true;
      }
    }
    if (any) program.steps.push_back(std::move(step));
  }
  for (int v : subgraph.inputs) {
    if (!receives_grad.count(v)) continue;
    if (graph.value(v).kind == ValueKind::Param) program.parameter_grads.push_back(v);
    else if (graph.value(v).kind == ValueKind::Activation) program.input_grads.push_back(v);
  }
  return program;
}

}  // namespace partrain
