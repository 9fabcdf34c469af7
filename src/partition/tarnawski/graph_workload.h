#pragma once
// The Tarnawski et al. planners (ideals, dpl, ip) on a model graph: the graph's non-constant tasks
// (or, for very large graphs, its layers) become the nodes of a dnn-partitioning Workload whose
// costs come from a CostModel, the DP or the integer program splits them over accelerators, and the
// split becomes a Plan.
#include <cstdint>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "plan/plan.h"
#include "partition/common/planner_options.h"
#include "partition/tarnawski/workload.h"

namespace partrain::partition {

/// A Workload with one forward node per group of tasks (each group's tasks run together): accelerator
/// latency = forward + backward ms of the group at `batch` samples, size = model-state bytes +
/// activation bytes, one edge per pair of groups connected by an activation, costing the ms to move it
/// forward and its gradient back. No CPUs; `accelerators` devices of the cost model's memory.
Workload workload_from_groups(const Graph& graph, const std::vector<std::vector<int>>& groups, const CostModel& cost,
                              std::int64_t batch, int accelerators, const PlannerOptions& options);

/// How plan_tarnawski splits each workload.
enum class TarnawskiSplit {
  ideals,           // the exact DP over ideals (§5.1.1, §5.3)
  dpl,              // the linearised DP (§5.1.2)
  integer_program,  // the contiguous throughput program (§5.1.3) with devices in pipeline order,
                    // through CBC, started from the DP's split (DPL's beyond max_ideals), within
                    // options.ip_time_limit_seconds and ip_relative_gap per device count
};

/// The ideals, dpl or ip planner on a model: for each divisor K of the world size, split into at
/// most K stages (one accelerator each), give the stages world_size / S replicas when S divides the
/// world size, predict, and keep the fastest plan. Nodes are the non-constant tasks (layers when
/// there are more than 4000). Throws partrain::Error when nothing fits or there are too many ideals
/// (the message suggests dpl), and for the ip planner with options.ip_contiguous false: training
/// runs each stage as a convex subgraph with activations flowing one way, so §5.2's non-contiguous
/// splits cannot become a Plan (the message says so and points to --workload).
Plan plan_tarnawski(const Graph& graph, const CostModel& cost, const PlannerOptions& options, TarnawskiSplit split);

}  // namespace partrain::partition
