#pragma once
// DPL, the linearisation heuristic of Tarnawski et al. (NeurIPS 2020, §5.1.2): fix one topological
// order of the contracted forward DAG and run the ideal DP over its prefixes only (n+1 ideals,
// O(n^2 (k+l)) transitions). Same cost model as partition_ideals (ms, bytes); never better than it.
#include "partition/tarnawski/ideals_dp.h"

namespace partrain::partition {

/// The prefixes of `order` (a topological order of the classes) as an ideal family (a chain).
IdealFamily prefix_ideals(const ClassGraph& graph, const std::vector<std::size_t>& order);

/// DPL split using the topological order of the DP's class graph (dp_class_graph). Throws
/// partrain::Error when infeasible.
PartitionResult partition_linearised(const Workload& workload, const PartitionOptions& options);

}  // namespace partrain::partition
