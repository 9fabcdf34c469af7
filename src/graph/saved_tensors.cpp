#include "graph/saved_tensors.h"

#include <algorithm>

#include "graph/op_schema.h"

namespace partrain {

namespace {
// Adds the saved inputs and outputs of `task` that are microbatch values to `saved`.
void add_saved_of_task(const Graph& graph, const Task& task, std::vector<int>& saved) {
  const OpSchema& schema = op_schema(task.op);
  for (std::size_t i = 0; i < task.inputs.size(); ++i)
    if (schema.input_is_saved(i) && is_microbatch_value(graph, task.inputs[i])) saved.push_back(task.inputs[i]);
  for (std::size_t i = 0; i < task.outputs.size(); ++i)
    if (schema.output_is_saved(i) && is_microbatch_value(graph, task.outputs[i])) saved.push_back(task.outputs[i]);
}

std::vector<int> sorted_unique(std::vector<int> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}
}  // namespace

bool is_microbatch_value(const Graph& graph, int value) {
  const ValueKind kind = graph.value(value).kind;
  return kind == ValueKind::Activation || kind == ValueKind::Input || kind == ValueKind::Label;
}

std::vector<int> saved_for_backward(const Graph& graph, const BackwardProgram& program) {
  std::vector<int> saved;
  for (const BackwardStep& step : program.steps) add_saved_of_task(graph, graph.task(step.task), saved);
  return sorted_unique(std::move(saved));
}

std::vector<int> saved_for_backward(const Graph& graph, const std::vector<int>& tasks) {
  std::vector<int> saved;
  for (int id : tasks) {
    const Task& task = graph.task(id);
    if (!task.constant) add_saved_of_task(graph, task, saved);
  }
  return sorted_unique(std::move(saved));
}

std::size_t release_unsaved(const Graph& graph, TensorMap& values, const std::unordered_set<int>& keep) {
  std::size_t released = 0;
  for (auto& [id, tensor] : values) {
    if (!tensor.defined() || keep.count(id) || !is_microbatch_value(graph, id)) continue;
    released += tensor.nbytes();
    tensor = tensor.shape_only();
  }
  return released;
}

}  // namespace partrain
