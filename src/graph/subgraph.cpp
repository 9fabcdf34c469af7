#include "graph/subgraph.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"

namespace partrain {

bool is_convex(const Graph& graph, std::span<const int> tasks) {
  if (tasks.empty()) return true;
  const auto [lowest, highest] = std::minmax_element(tasks.begin(), tasks.end());
  const int first = *lowest, last = *highest;
  // Task ids are topological, so a path from S back into S only visits ids in (first, last].
  // Sweep ids upwards: an outside task is "tainted" when it is reachable from S through outside
  // tasks; S is not convex when a member reads a tainted task's output.
  std::vector<char> member(last - first + 1, 0), tainted(last - first + 1, 0);
  for (int t : tasks) member[t - first] = 1;
  for (int t = first; t <= last; ++t) {
    bool reads_from_set = false, reads_tainted = false;
    for (int input : graph.task(t).inputs) {
      const int producer = graph.value(input).producer;
      if (producer < first || producer > last) continue;
      if (member[producer - first]) reads_from_set = true;
      if (tainted[producer - first]) reads_tainted = true;
    }
    if (member[t - first]) {
      if (reads_tainted) return false;
    } else if (reads_from_set || reads_tainted) {
      tainted[t - first] = 1;
    }
  }
  return true;
}

std::vector<int> Subgraph::parameters(const Graph& graph) const {
  std::vector<int> result;
  for (int v : inputs)
    if (graph.value(v).kind == ValueKind::Param) result.push_back(v);
  return result;
}

std::vector<int> Subgraph::boundary_activations(const Graph& graph) const {
  std::vector<int> result;
  for (int v : inputs)
    if (graph.value(v).kind == ValueKind::Activation) result.push_back(v);
  return result;
}

Subgraph extract_subgraph(const Graph& graph, std::span<const int> tasks) {
  PARTRAIN_CHECK(!tasks.empty(), "a subgraph needs at least one task");
  std::vector<int> sorted(tasks.begin(), tasks.end());
  std::sort(sorted.begin(), sorted.end());
  PARTRAIN_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "duplicate task in subgraph");
  for (int t : sorted) graph.task(t);  // validates ids
  PARTRAIN_CHECK(is_convex(graph, sorted), "task set of " << sorted.size() << " tasks starting at '"
                                                          << graph.task(sorted.front()).name << "' is not convex");
  Subgraph subgraph;
  subgraph.tasks = sorted;  // ids are a topological order
  std::vector<char> inside(graph.tasks().size(), 0);
  for (int t : sorted) inside[t] = 1;
  for (int t : sorted) {
    for (int input : graph.task(t).inputs) {
      const int producer = graph.value(input).producer;
      if (producer < 0 || !inside[producer]) subgraph.inputs.push_back(input);
    }
    for (int output : graph.task(t).outputs) {
      bool leaves = graph.is_output(output);
      for (int consumer : graph.value(output).consumers) leaves = leaves || !inside[consumer];
      if (leaves) subgraph.outputs.push_back(output);
    }
  }
  std::sort(subgraph.inputs.begin(), subgraph.inputs.end());
  subgraph.inputs.erase(std::unique(subgraph.inputs.begin(), subgraph.inputs.end()), subgraph.inputs.end());
  std::sort(subgraph.outputs.begin(), subgraph.outputs.end());
  return subgraph;
}

Subgraph whole_graph(const Graph& graph) {
  std::vector<int> all(graph.tasks().size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return extract_subgraph(graph, all);
}

Graph standalone_graph(const Graph& graph, const Subgraph& subgraph) {
  Graph result;
  std::unordered_map<int, int> mapped;  // original value id -> new value id
  for (int v : subgraph.inputs) {
    const Value& value = graph.value(v);
    switch (value.kind) {
      case ValueKind::Input:
      case ValueKind::Activation: mapped[v] = result.add_input(value.name, value.type.shape, value.type.dtype); break;
      case ValueKind::Label: mapped[v] = result.add_label(value.name, value.type.shape, value.type.dtype); break;
      case ValueKind::Param: mapped[v] = result.add_parameter(value.name, value.type.shape); break;
      case ValueKind::Buffer: mapped[v] = result.add_buffer(value.name, value.type.shape); break;
      case ValueKind::Const: mapped[v] = result.add_constant(value.name, graph.constant_data(v)); break;
    }
  }
  for (int t : subgraph.tasks) {
    const Task& task = graph.task(t);
    std::vector<int> inputs;
    for (int input : task.inputs) inputs.push_back(mapped.at(input));
    const std::vector<int> outputs = result.add_task(task.op, task.name, inputs, task.attributes);
    for (std::size_t k = 0; k < outputs.size(); ++k) mapped[task.outputs[k]] = outputs[k];
  }
  for (int v : subgraph.outputs) result.mark_output(mapped.at(v));
  return result;
}

}  // namespace partrain
