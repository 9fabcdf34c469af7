#pragma once
// Entry point of planning on rank 0 and in `partrain plan`: the dispatch by planner name (rannc,
// ideals, dpl, ip, capslog, merak, uniform, manual; options in common/planner_options.h) and the
// search over tensor-parallel and ZeRO layouts.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "partition/common/planner_options.h"
#include "plan/plan.h"

namespace partrain::partition {

/// Runs the named planner on `graph`, whose tensor-parallel degree t = tensor_parallel_degree(graph)
/// the plan records: the planner lays out world_size / t groups of t consecutive ranks as devices
/// (a node holds devices_per_node / t of them) and the plan's stages index `graph`. Every planner
/// returns a validated Plan with predictions filled in. Throws partrain::Error for an unknown
/// planner, for options.tensor_parallel > 1 that is not the graph's degree, for a t that does not
/// divide the world size, or when no plan fits: the message names the smallest device memory or
/// device count that would work (when the planner can tell).
///
/// rannc refines its blocks instead of giving up (issue 13): a block that cannot fit on one device
/// even alone (recomputation, one microbatch in flight, one sample) is split in two, recursively,
/// and when the stage DP still finds no split the block count is doubled (up to 3 times, at most
/// one block per atomic component) before "no plan fits".
/// With options.choose_schedule, plans under 1f1b and under zb_h1 (Qi et al. 2024 §2.1: a third of
/// 1F1B's bubble, every stage holding 1F1B's first stage's activations), for the merak planner also
/// under its shifted critical path schedule (Merak §6.1), then a zb_v plan of the
/// better one's depth and microbatches from the uniform planner (2S chunks of near-equal layer
/// counts in a V), and returns the plan with the shortest predicted step of those that fit; throws
/// only when none fits.
Plan make_plan(const Graph& graph, const CostModel& cost, const PlannerOptions& options);

/// Makes the cost model of a graph (the model or one of its tensor_parallel_graphs); the graph
/// outlives the model.
using CostModelFactory = std::function<std::unique_ptr<CostModel>(const Graph& graph)>;

/// The graph of a tensor-parallel degree with or without sequence parallelism:
/// tensor_parallel_graph(model, t, sequence_parallel) (graph/tensor_parallel.h), the model itself
/// for t = 1 (either way). The caller builds each once and keeps it alive while planning (the app
/// keeps one per process); throws partrain::Error when t (or sequence parallelism) does not apply.
using TensorParallelGraphs = std::function<const Graph&(int tensor_parallel, bool sequence_parallel)>;

/// A TensorParallelGraphs over `model` that builds each (degree, sequence parallelism) the first
/// time it is asked for and keeps it (in the returned function) for later calls; `model` must
/// outlive it.
TensorParallelGraphs tensor_parallel_graphs_of(const Graph& model);

/// One (t, zero) layout make_3d_plan tried.
struct LayoutCandidate {
  int tensor_parallel = 1;
  int zero = 0;
  bool sequence_parallel = false;
  bool feasible = false;
  double samples_per_second = 0;  // the plan's prediction when feasible
  int stages = 0;                 // the plan's stages and pipeline replicas when feasible
  int pipeline_replicas = 0;
  int blocks = 0;                 // > 0: the block count of a refinement pass (PlannerOptions::refine_blocks)
  int virtual_stages = 1;         // model chunks per pipeline stage (interleaved schedule) when feasible
  std::string problem;            // why not, when not feasible
  double planning_seconds = 0;    // wall time of this candidate (graph, cost model and planner)
};

/// The plan make_3d_plan chose and the graph its stages index.
struct ThreeDimensionalPlan {
  Plan plan;
  Graph graph;  // tensor_parallel_graph(model, plan.tensor_parallel, plan.sequence_parallel) (the model for t = 1)
  std::vector<LayoutCandidate> candidates;  // every layout tried, in the order tried
};

/// The tensor-parallel degrees make_3d_plan tries for `model` on `device`: options.tensor_parallel
/// when it is positive, else each t ∈ {1, 2, 4, 8} with t ≤ devices_per_node that divides the
/// world size and for which tensor_parallel_graph(model, t, options.sequence_parallel) exists (t
/// divides heads, hidden and intermediate size, and the sequence with sequence parallelism; the
/// model has tensor-parallel layers). The vocabulary does not limit t: the graph pads it to a
/// multiple of [model] vocab_divisible_by × t, as Megatron-LM does. Always holds 1 in the automatic
/// case.
std::vector<int> tensor_parallel_candidates(const TensorParallelGraphs& graphs, const DeviceSpec& device,
                                           const PlannerOptions& options);
/// The same over tensor_parallel_graphs_of(model) (each degree built here and dropped).
std::vector<int> tensor_parallel_candidates(const Graph& model, const DeviceSpec& device, const PlannerOptions& options);

/// The sequence-parallel settings make_3d_plan tries at degree t: false for t = 1; both (false
/// first) when options.choose_sequence_parallel; else options.sequence_parallel.
std::vector<bool> sequence_parallel_choices(const PlannerOptions& options, int t);

/// Planning in three dimensions (docs/parallelism.md §Choosing t and ZeRO automatically; Merak §3.2):
/// for every tensor-parallel degree of tensor_parallel_candidates and every ZeRO stage (options.zero,
/// or 0 and 1 when it is −1) and, for t > 1, with and without sequence parallelism when
/// options.choose_sequence_parallel (else options.sequence_parallel), takes graphs(t, sequence
/// parallel) (the model is graphs(1, false)), its cost model from `costs`,
/// and runs make_plan (pipeline stages × replicas × microbatches) on world_size / t groups; keeps
/// the plan with the highest predicted samples per second that fits the memory (ties: smaller t,
/// then zero 0, then sequence parallelism, which keeps less). Degrees are tried from the largest down, and the best stage-DP objective found so
/// far bounds rannc's search of the later candidates (PlannerOptions::step_seconds_bound): a layout
/// whose DP objective cannot beat it is reported as such and not planned further. This is RaNNC's
/// own ranking of configurations (Algorithm 2) carried across layouts; the simulated step time that
/// chooses among the surviving plans may rank two layouts otherwise in rare cases. Progress goes to
/// options.progress over the whole search. Throws partrain::Error
/// when no (tensor_parallel, stages, replicas, zero) layout fits, with each candidate's reason, and
/// when the degree asked for does not apply to the model (naming heads/hidden/intermediate).
ThreeDimensionalPlan make_3d_plan(const TensorParallelGraphs& graphs, const CostModelFactory& costs,
                                  const PlannerOptions& options);
/// The same over tensor_parallel_graphs_of(model).
ThreeDimensionalPlan make_3d_plan(const Graph& model, const CostModelFactory& costs, const PlannerOptions& options);

}  // namespace partrain::partition
