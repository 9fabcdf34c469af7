#include "graph/autodiff.h"

#include <algorithm>
#include <unordered_set>

namespace partrain {

namespace {

// Forward sweep over `tasks` (topological order): adds to `requires_grad` every floating output of
// a task with a differentiable input already in it.
void propagate_requires_grad(const Graph& graph, const std::vector<int>& tasks, std::unordered_set<int>& requires_grad) {
  for (int t : tasks) {
    const Task& task = graph.task(t);
    const OpSchema& schema = op_schema(task.op);
    bool any = false;
    for (std::size_t i = 0; i < task.inputs.size(); ++i)
      any = any || (schema.input_is_differentiable(i) && requires_grad.count(task.inputs[i]));
    if (any)
      for (int output : task.outputs)
        if (is_floating(graph.value(output).type.dtype)) requires_grad.insert(output);
  }
}

}  // namespace

std::unordered_set<int> values_requiring_gradient(const Graph& graph) {
  const Subgraph whole = whole_graph(graph);
  std::unordered_set<int> requires_grad;
  for (int v : whole.inputs)
    if (graph.value(v).kind == ValueKind::Param) requires_grad.insert(v);
  propagate_requires_grad(graph, whole.tasks, requires_grad);
  return requires_grad;
}

BackwardProgram build_backward(const Graph& graph, const Subgraph& subgraph, std::span<const int> gradient_inputs) {
  // Forward sweep: which values depend differentiably on a parameter or a boundary activation.
  const std::unordered_set<int> stand_ins(gradient_inputs.begin(), gradient_inputs.end());
  std::unordered_set<int> requires_grad;
  for (int v : subgraph.inputs) {
    const ValueKind kind = graph.value(v).kind;
    const bool boundary = kind == ValueKind::Activation || (kind == ValueKind::Input && stand_ins.count(v));
    if ((kind == ValueKind::Param || boundary) && is_floating(graph.value(v).type.dtype)) requires_grad.insert(v);
  }
  propagate_requires_grad(graph, subgraph.tasks, requires_grad);

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
    else program.input_grads.push_back(v);  // a boundary activation, or an Input standing for one
  }
  return program;
}

BackwardProgram standalone_backward(const Graph& graph, const Subgraph& subgraph, const Graph& standalone) {
  const std::unordered_set<int> requiring = values_requiring_gradient(graph);
  std::vector<int> stand_ins;  // standalone_graph keeps the names of the values it cuts
  for (int v : subgraph.boundary_activations(graph))
    if (requiring.count(v)) stand_ins.push_back(standalone.value_id(graph.value(v).name));
  return build_backward(standalone, whole_graph(standalone), stand_ins);
}

SplitBackward split_backward(const Graph& graph, const BackwardProgram& program,
                             const std::function<bool(std::size_t)>& deferrable) {
  const std::unordered_set<int> parameters(program.parameter_grads.begin(), program.parameter_grads.end());
  // A parameter waits for the weight half only when all its steps may wait (tied parameters read
  // by several steps are handed over once, as in the whole program).
  std::unordered_set<int> kept_in_input;
  for (std::size_t i = 0; i < program.steps.size(); ++i) {
    if (!deferrable || deferrable(i)) continue;
    const Task& task = graph.task(program.steps[i].task);
    for (std::size_t k = 0; k < task.inputs.size(); ++k)
      if (program.steps[i].input_grad_needed[k] && parameters.count(task.inputs[k])) kept_in_input.insert(task.inputs[k]);
  }
  auto deferred = [&](int value) { return parameters.count(value) && !kept_in_input.count(value); };

  SplitBackward split;
  split.input.output_grads = program.output_grads;
  split.input.input_grads = program.input_grads;
  std::unordered_set<int> kept_grads;
  for (const BackwardStep& step : program.steps) {
    const Task& task = graph.task(step.task);
    BackwardStep input{step.task, std::vector<bool>(step.input_grad_needed.size(), false)};
    BackwardStep weight = input;
    bool any_input = false, any_weight = false;
    for (std::size_t k = 0; k < task.inputs.size(); ++k) {
      if (!step.input_grad_needed[k]) continue;
      const bool later = deferred(task.inputs[k]);
      (later ? weight : input).input_grad_needed[k] = true;
      (later ? any_weight : any_input) = true;
    }
    if (any_input) split.input.steps.push_back(std::move(input));
    if (any_weight) {
      split.weight.steps.push_back(std::move(weight));
      kept_grads.insert(task.outputs.begin(), task.outputs.end());
    }
  }
  for (int value : program.parameter_grads)
    (deferred(value) ? split.weight : split.input).parameter_grads.push_back(value);
  split.input.kept_output_grads.assign(kept_grads.begin(), kept_grads.end());
  std::sort(split.input.kept_output_grads.begin(), split.input.kept_output_grads.end());
  return split;
}

std::vector<int> step_positions(const BackwardProgram& program, const BackwardProgram& half) {
  std::vector<int> positions(program.steps.size(), -1);
  std::size_t next = 0;
  for (std::size_t i = 0; i < program.steps.size() && next < half.steps.size(); ++i)
    if (program.steps[i].task == half.steps[next].task) positions[i] = static_cast<int>(next++);
  return positions;
}

}  // namespace partrain
