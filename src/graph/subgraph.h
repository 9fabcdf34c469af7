#pragma once
// Convex subgraphs: the unit that partitioners produce (blocks, stages) and the runtime executes.
// A task set S is convex when no path leaves S and re-enters it; then S can run as one stage that
// receives its boundary inputs, computes, and sends its boundary outputs.
#include <span>
#include <vector>

#include "graph/graph.h"

namespace partrain {

/// True when the task set is convex. Runs in O(edges between the smallest and largest task id
/// of the set), so checking the ~15,000-task graphs of RaNNC's enlarged BERT stays cheap.
bool is_convex(const Graph& graph, std::span<const int> tasks);

/// A convex task set with its boundary values.
struct Subgraph {
  std::vector<int> tasks;        // topological order
  std::vector<int> inputs;       // values read by the tasks but not produced by them, ascending id
                                 // (inputs, labels, params, buffers, consts and boundary activations)
  std::vector<int> outputs;      // values produced here and read by a task outside or marked as graph
                                 // outputs, ascending id
  /// The inputs of kind Param.
  std::vector<int> parameters(const Graph& graph) const;
  /// The inputs of kind Activation (received from another stage).
  std::vector<int> boundary_activations(const Graph& graph) const;
};

/// The subgraph of the given tasks (any order, no duplicates). Throws partrain::Error if the set
/// is empty or not convex.
Subgraph extract_subgraph(const Graph& graph, std::span<const int> tasks);
/// The whole graph as one subgraph.
Subgraph whole_graph(const Graph& graph);

/// A standalone graph holding only the subgraph's tasks (a trimmed model, used to profile one
/// stage): boundary activations become Input values of the same name and shape, every other
/// boundary value keeps its kind, the subgraph's outputs become graph outputs. Task names are kept,
/// so random streams and parameter names match the original.
Graph standalone_graph(const Graph& graph, const Subgraph& subgraph);

}  // namespace partrain
