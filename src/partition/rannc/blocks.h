#pragma once
// RaNNC (Tanaka et al., IPDPS 2021) §III-B: multilevel partitioning of the atomic subcomponents
// into k convex blocks in pipeline order, which the stage DP (§III-C) then groups into stages.
//
// Phases (partition_blocks_detailed):
//  1. Coarsening. Level by level, groups are visited in ascending compute time; each merges with
//     the adjacent group (an edge between them, either direction) that gives the smallest merged
//     compute time, provided the merged group is convex, fits memory and is not much heavier
//     than the level's groups (at most mean + 2 standard deviations by default, RaNNC's guard;
//     see BlockOptions::merge_ceiling_sigmas). Each group merges at most once per level; merging
//     stops once k groups remain, and coarsening stops at a level that merges nothing.
//     Convexity is kept at group level: the groups form a DAG (the quotient graph) whose
//     topological order is maintained incrementally (Pearce–Kelly), so checking a merge only
//     searches groups between the two in that order.
//  2. Uncoarsening. From the coarsest level down to the atomic components, every group of the
//     finer level (a "unit") that touches another coarse group may move there when that lowers
//     the communication time (activation bytes crossing group boundaries / bandwidth) and the
//     coarse groups stay convex (the quotient graph stays acyclic) and within memory. Moves act
//     on the coarsest grouping, so later (finer) levels refine boundaries that earlier moves set.
//  3. Compaction. The groups are put in a topological order (Kahn, smallest task id first) and
//     that sequence is split into k contiguous parts minimising the largest part's compute time
//     under the memory limit (an optimal bottleneck split, found by bisection on the bound with a
//     greedy feasibility test; RaNNC instead merges the smallest group with a neighbour until k
//     remain). Contiguous ranges of a topological order are convex and keep pipeline order.
//
// Costs are additive per task and given by the caller. A constant task cloned into several
// components is counted once per group (it runs once in each block holding it).
#include <cstdint>
#include <limits>
#include <vector>

#include "graph/graph.h"
#include "partition/rannc/atomic.h"

namespace partrain::partition {

/// Inputs of the block partitioning (RaNNC §III-B). Task costs are per task id.
struct BlockOptions {
  int blocks = 32;                          // k; fewer blocks if there are fewer atomic components
  std::vector<double> task_seconds;         // per task id: forward+backward compute time (s) at the profiling batch
  std::vector<double> task_memory_bytes;    // per task id: memory the task adds to a device (bytes)
  double memory_limit_bytes = std::numeric_limits<double>::infinity();  // a group must fit (sum of its
                                            // tasks' memory, clones counted once per group)
  double bandwidth_bytes_per_second = 1e10; // for communication time of the values crossing a group boundary
  std::int64_t batch = 1;                   // activation bytes of a value = TensorType bytes with kBatch = batch
  double merge_ceiling_sigmas = 2;          // coarsening skips a merge whose compute time exceeds the level's
                                            // mean group compute + this many standard deviations (RaNNC's
                                            // guard against oversized groups); infinity: no guard
  bool coarsen = true;                      // run phase 1 (off: compaction works on the atomic components)
  bool uncoarsen = true;                    // run phase 2
};

/// A convex set of tasks that the stage DP keeps together.
struct Block {
  std::vector<int> tasks;       // ascending, includes cloned constant tasks
  double compute_seconds = 0;   // sum of task_seconds over `tasks` (s)
  double memory_bytes = 0;      // sum of task_memory_bytes over `tasks` (bytes)
};

/// The blocks and what each phase achieved.
struct BlockPartition {
  std::vector<Block> blocks;                    // pipeline order: every edge stays in a block or goes to a later one
  int coarsening_levels = 0;                    // levels that merged at least one pair
  std::size_t coarsened_groups = 0;             // groups after coarsening (= atomic components when off)
  double coarsened_communication_seconds = 0;   // communication time of the coarsest grouping (s)
  double uncoarsened_communication_seconds = 0; // the same after uncoarsening, never larger (s)
  int uncoarsening_moves = 0;                   // units moved between coarse groups
  double communication_seconds = 0;             // communication time of `blocks` (s)
};

/// Bytes of an activation value with the symbolic batch dimension set to `batch`.
double activation_bytes(const Graph& graph, int value, std::int64_t batch);

/// Communication time (s) of a grouping of the graph's tasks: every activation produced by a
/// non-constant task is sent once to each other block that reads it, at
/// options.bandwidth_bytes_per_second, with options.batch as the batch size. Only the non-constant
/// tasks of the blocks are looked at (constant clones never communicate). Throws partrain::Error
/// when a non-constant task is in no block or in two.
double communication_seconds(const Graph& graph, const std::vector<Block>& blocks, const BlockOptions& options);

/// Runs coarsening, uncoarsening and compaction (RaNNC §III-B) on the atomic components of
/// `graph` (from atomic_components). Returns exactly options.blocks blocks when there are at least
/// that many components; fewer when there are fewer components (one block per component); more
/// only when the memory limit forbids merging further (every block then still fits).
/// Throws partrain::Error on bad options (blocks < 1, cost vectors not one entry per task,
/// bandwidth <= 0, batch < 1, merge_ceiling_sigmas < 0, components that do not cover the graph's
/// non-constant tasks exactly once) and when an atomic component alone exceeds the memory limit
/// (naming it and the smallest limit that works).
BlockPartition partition_blocks_detailed(const Graph& graph, const std::vector<AtomicComponent>& components,
                                         const BlockOptions& options);

/// partition_blocks_detailed(...).blocks.
std::vector<Block> partition_blocks(const Graph& graph, const std::vector<AtomicComponent>& components,
                                    const BlockOptions& options);

}  // namespace partrain::partition
