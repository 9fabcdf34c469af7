#pragma once
// Merak's graph sharding (Lai et al., "Merak: An Efficient Distributed DNN Training Framework With
// Automated 3D Parallelism for Giant Foundation Models", IEEE TPDS 34(5), 2023, §4.1, Algorithms
// 1–2) and the `merak` planner built on it.
//
// Merak cuts the operator graph, walked in topological order, into a sequence of shards of about
// equal parameter count, such that consecutive shards talk through one tensor (the last node of the
// previous shard) plus the outputs of "common nodes":
//   - common nodes (Algorithm 2's preprocessing): nodes whose outputs have more than a threshold of
//     users (5 in the authors' code), e.g. an attention mask used by every layer; their outputs are
//     sent on to any later shard and never force shards together;
//   - farthest-dependency search (Algorithm 2): for each node, the earliest shard it depends on
//     other than through the previous shard's output or a common node: an input produced inside
//     shard k forces k, the output of shard k < c − 1 forces k + 1;
//   - sharding (Algorithm 1): when that shard precedes the current one, every shard from it to the
//     current one collapses into one; the node joins the current shard; once the shard's parameter
//     count exceeds the threshold (total parameters without embedding tables / shard count, an
//     embedding table counting threshold + 1), the shard closes after this node (never right after
//     an embedding lookup) and a new one starts.
// The paper's text was not available to us; this follows the authors' released implementation
// (Merak/core/fx/graph_shard/farthest_deps.py) mapped onto partrain graphs: graph inputs, labels,
// parameters and constants impose no order (every stage may read them), constant tasks are cloned
// into every shard that consumes them (as layer_groups does), and shards are contiguous runs of
// non-constant tasks in id (topological) order, hence convex.
#include <cstdint>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "plan/plan.h"
#include "partition/common/planner_options.h"

namespace partrain::partition {

struct MerakShardOptions {
  /// Parameter elements per shard before it closes; 0: merak_parameter_threshold(graph, shard_count).
  std::int64_t parameter_threshold = 0;
  /// Shards aimed for when the threshold is derived; 0: the number of layers (layer_groups).
  int shard_count = 0;
  /// A task whose outputs have more uses than this (counting every consumer entry) is a common node.
  int common_node_uses = 5;
};

/// One shard: a convex task set of the graph.
struct MerakShard {
  std::vector<int> tasks;                 // ascending; constant tasks cloned into each consuming shard
  std::int64_t parameter_count = 0;       // parameter elements the shard reads (each once)
  std::int64_t counted_parameters = 0;    // the same with each embedding table counted threshold + 1
  int output_task = -1;                   // the task after which the shard closed; -1 for the last shard
};

/// Non-constant tasks whose outputs have more than `uses` uses in total, ascending (Merak's common
/// nodes). Throws partrain::Error for uses < 0.
std::vector<int> merak_common_nodes(const Graph& graph, int uses);

/// Merak's per-shard parameter threshold: (parameter elements of the graph without the embedding
/// tables, i.e. the Params that Gather tasks look up) / shard_count, at least 1. Throws
/// partrain::Error for shard_count < 1.
std::int64_t merak_parameter_threshold(const Graph& graph, int shard_count);

/// Merak Algorithms 1–2: the shards of the graph in pipeline order. Every non-constant task is in
/// exactly one shard; each shard is convex; every activation that crosses shards either is the
/// output task of the shard just before its consumer's or comes from a common node; every shard but
/// the last has counted_parameters > threshold. Throws partrain::Error for a graph without tasks or
/// bad options.
std::vector<MerakShard> merak_shards(const Graph& graph, const MerakShardOptions& options = {});

/// The [first, last) shard ranges of `stages` contiguous stages minimising the largest stage cost
/// (exact min-max DP over prefix sums of `shard_costs`, O(stages · n²)); ties go to the split found
/// first (earliest boundaries). Throws partrain::Error for stages < 1 or more stages than shards.
std::vector<std::pair<std::size_t, std::size_t>> balanced_contiguous_ranges(const std::vector<double>& shard_costs,
                                                                            int stages);

/// The `merak` planner: merak_shards with default options, grouped into S contiguous stages of
/// balanced compute (forward + backward seconds of CostModel::measure of each shard at the
/// per-replica microbatch, balanced_contiguous_ranges). S = options.stages, or else the divisor of
/// the world size (at most the shard count) whose plan fits and predicts the shortest step (the
/// schedule simulated, plan_from_stages); replicas equal_replicas; the schedule from the options
/// (make_plan's choice under schedule "auto" includes Merak's shifted critical path, §6.1);
/// recomputation from the options, where "auto" is Merak's stage-aware recomputation (§6.2:
/// choose_stage_aware_recomputation keeps per stage the layers its memory holds); microbatches,
/// predictions and the memory check by plan_from_stages. Interleaving and sequence parallelism are
/// not Merak's (its pipeline is one chunk per stage; it splits layers by Megatron's tensor
/// parallelism only): the 3D search around it chooses t and ZeRO as for every planner. Throws
/// partrain::Error for more stages than shards, a stage count that does not
/// divide the world size, or (S unset) when no stage count fits, naming each count's reason.
Plan plan_merak(const Graph& graph, const CostModel& cost, const PlannerOptions& options);

}  // namespace partrain::partition
