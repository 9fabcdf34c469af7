#include "graph/interpreter.h"

#include <unordered_set>

namespace partrain {

namespace {
Tensor lookup(const Graph& graph, const TensorMap& values, int id, const Task& task, Backend& backend) {
  auto it = values.find(id);
  if (it != values.end()) return it->second;
  // Constants (position ids) live on the host in the graph; small, so copied per use on a GPU.
  if (graph.value(id).kind == ValueKind::Const) return to_backend(graph.constant_data(id), backend);
  PARTRAIN_FAIL("task '" << task.name << "': input '" << graph.value(id).name << "' has no tensor");
}

KernelContext context_for(const Task& task, Backend& backend, const ExecutionOptions& options) {
  RandomContext random = options.random;
  random.stream = name_stream(task.name);
  return KernelContext{task.attributes, backend, options.training, random, options.tensor_parallel};
}
}  // namespace

void run_forward(const Graph& graph, const Subgraph& subgraph, TensorMap& values, Backend& backend,
                 const ExecutionOptions& options) {
  for (int t : subgraph.tasks) {
    const Task& task = graph.task(t);
    std::vector<Tensor> inputs;
    std::vector<TensorType> input_types;
    for (int input : task.inputs) {
      inputs.push_back(lookup(graph, values, input, task, backend));
      input_types.push_back({inputs.back().shape(), inputs.back().dtype()});
    }
    std::vector<Tensor> outputs;
    try {
      for (const TensorType& type : infer_output_types(task.op, task.attributes, input_types))
        outputs.push_back(backend.empty(type.shape, type.dtype));
      backend.forward(task.op, context_for(task, backend, options), inputs, outputs);
    } catch (const Error& error) {
      PARTRAIN_FAIL("task '" << task.name << "' (" << op_name(task.op) << ") forward: " << error.message());
    }
    for (std::size_t k = 0; k < outputs.size(); ++k) values[task.outputs[k]] = outputs[k];
  }
}

void run_backward(const Graph& graph, const BackwardProgram& program, const TensorMap& values, TensorMap& grads,
                  Backend& backend, const ExecutionOptions& options) {
  for (int v : program.output_grads)
    PARTRAIN_CHECK(grads.count(v), "backward: no gradient given for output '" << graph.value(v).name << "'");
  const std::unordered_set<int> parameters(program.parameter_grads.begin(), program.parameter_grads.end());
  const std::unordered_set<int> kept(program.input_grads.begin(), program.input_grads.end());
  // Parameter gradients computed in this call, accumulated into what the caller had.
  TensorMap fresh_parameter_grads;

  for (const BackwardStep& step : program.steps) {
    const Task& task = graph.task(step.task);
    std::vector<Tensor> inputs, outputs, output_grads, input_grads;
    for (int input : task.inputs) inputs.push_back(lookup(graph, values, input, task, backend));
    for (int output : task.outputs) {
      outputs.push_back(lookup(graph, values, output, task, backend));
      auto it = grads.find(output);
      output_grads.push_back(it != grads.end() ? it->second : backend.zeros(outputs.back().shape(), outputs.back().dtype()));
    }
    for (std::size_t i = 0; i < task.inputs.size(); ++i)
      input_grads.push_back(step.input_grad_needed[i] ? backend.empty(inputs[i].shape(), inputs[i].dtype()) : Tensor());
    try {
      backend.backward(task.op, context_for(task, backend, options), inputs, outputs, output_grads, input_grads);
    } catch (const Error& error) {
      PARTRAIN_FAIL("task '" << task.name << "' (" << op_name(task.op) << ") backward: " << error.message());
    }
    // The outputs' gradients are complete and now used: free them unless the caller wants them.
    for (int output : task.outputs)
      if (!kept.count(output)) grads.erase(output);
    for (std::size_t i = 0; i < task.inputs.size(); ++i) {
      if (!input_grads[i].defined()) continue;
      const int input = task.inputs[i];
      TensorMap& target = parameters.count(input) ? fresh_parameter_grads : grads;
      auto [it, inserted] = target.emplace(input, input_grads[i]);
      if (!inserted) backend.accumulate(it->second, input_grads[i]);
    }
  }
  for (auto& [id, gradient] : fresh_parameter_grads) {
    auto [it, inserted] = grads.emplace(id, gradient);
    if (!inserted) backend.accumulate(it->second, gradient);
  }
}

}  // namespace partrain
