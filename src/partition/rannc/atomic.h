#pragma once
// RaNNC (Tanaka et al., IPDPS 2021) §III-A: atomic subcomponents. The operator graph is cut into
// the smallest pieces a partitioner ever moves: one piece per task that depends on the batch
// (a non-constant task), together with the constant tasks (Task::constant: they depend only on
// parameters, buffers and constants) that compute its inputs. A constant task needed by several
// pieces is cloned into each, so pieces never exchange batch-independent values.
#include <vector>

#include "graph/graph.h"

namespace partrain::partition {

/// One atomic subcomponent (RaNNC §III-A).
struct AtomicComponent {
  int task = -1;              // the non-constant task this component is built around
  std::vector<int> tasks;     // ascending task ids: `task` plus the constant tasks it needs (cloned)
};

/// The atomic subcomponents of a graph, one per non-constant task, ordered by `task` (task ids are
/// a topological order, so this is one too). Each component holds its non-constant task and every
/// constant task it depends on through constant tasks only (transitively); a constant task feeding
/// several components appears in each. Constant tasks that no non-constant task needs (e.g. a
/// constant graph output) join the last component, which holds the graph's final task (the loss)
/// and so sits in the last pipeline stage, where graph outputs are collected.
/// An empty graph gives no components. Throws partrain::Error when the graph has tasks but none
/// depends on an Input or Label, or when a task's `constant` flag disagrees with its inputs.
std::vector<AtomicComponent> atomic_components(const Graph& graph);

}  // namespace partrain::partition
