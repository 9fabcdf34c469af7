#pragma once
// Shared steps of the planners that first decide stage boundaries (uniform, manual, merak, capslog,
// ideals, dpl) and then need replicas, microbatches, predictions and a memory check: one place, so
// every planner predicts time and memory the same way.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include "partition/common/planner_options.h"
#include "profile/memory_model.h"

namespace partrain::partition {

/// Tasks grouped by layer (graph/layer_names.h layer_of of the task name), groups in pipeline order
/// (sorted topologically by the edges between them, ties by first task; groups on a dependency cycle are
/// merged into one named "a+b"); constant tasks are cloned into every group that consumes them.
/// Each group's tasks are ascending; contiguous groups joined into stages never send backwards.
struct LayerGroup {
  std::string name;
  std::vector<int> tasks;   // ascending
};
std::vector<LayerGroup> layer_groups(const Graph& graph);

/// Adds to each stage (non-constant task lists in pipeline order) the constant tasks it needs,
/// cloned into every stage that consumes them (RaNNC §III-A), and sorts each stage.
std::vector<std::vector<int>> attach_constant_tasks(const Graph& graph, std::vector<std::vector<int>> stages);

/// Concatenates the tasks of groups [first, last) into one ascending task list.
std::vector<int> join_groups(const std::vector<LayerGroup>& groups, std::size_t first, std::size_t last);

/// The memory policy of stage `stage` of `stage_count` under the options' schedule, recompute
/// setting and microbatch count (1F1B keeps up to S − s microbatches in flight, GPipe all M;
/// interleaved with v chunks: `stage` is a model chunk of stage_count = S·v and holds about
/// (warm-up forward steps + 1) / v microbatches). With
/// options.zero = 1 the optimizer state is sharded over the stage's `data_parallel` ranks (its
/// replicas × pipeline replicas; ZeRO-1); the default 1 gives the unsharded upper bound.
profile::MemoryPolicy stage_memory_policy(const PlannerOptions& options, int stage, int stage_count, int microbatches,
                                          int data_parallel = 1);

/// Whether recomputation is on for a plan with `stage_count` stages under options.recompute.
RecomputePolicy recompute_policy(const PlannerOptions& options, int stage_count);

/// Fills a plan's per-stage predictions (forward/backward seconds at the per-replica microbatch,
/// memory) and recompute policies (stage_aware: Merak §6.2's fractions α_i of each stage's layers
/// kept, the rest recomputed, α_1 as large as the memory allows and the others from it), each stage's all-reduce, and predicted_step_seconds and
/// predicted_bubble_fraction from simulating the plan's schedule (plan/schedule_simulator.h) with
/// those costs, using `cost`. Requires stages, replicas, copies, batch and microbatches set.
void predict_plan(Plan& plan, const Graph& graph, const CostModel& cost, const PlannerOptions& options);

/// The largest predicted memory of a rank (Σ over its model chunks under interleaving) minus the
/// usable device memory (≤ 0 when the plan fits).
double memory_excess_bytes(const Plan& plan, const CostModel& cost, const PlannerOptions& options);

/// Peak bytes of a rank holding the model chunks `chunks` (by local chunk index) that passes through
/// the in-flight `states` of its compute order (plan/schedule.h): the chunks' model state plus the
/// largest in-flight activations and working memory (docs/planning.md §Memory).
double rank_peak_bytes(std::span<const profile::StageMemory> chunks, std::span<const InFlightState> states);

/// A plan with no stages yet, headed with what it is planned for: planner, graph hash, global batch,
/// schedule, precision and optimizer (with its state copies) from the options.
Plan plan_header(const Graph& graph, const PlannerOptions& options, const std::string& planner);

/// Records in `plan` the precision and optimizer the options plan for (train --plan checks them).
void record_planned_settings(Plan& plan, const PlannerOptions& options);

/// Appends one stage per task list (sorted ascending) to plan.stages, with replicas[s] replicas and
/// its summary. Throws partrain::Error when the two lists differ in length.
void append_stages(Plan& plan, const Graph& graph, std::vector<std::vector<int>> stage_tasks, const std::vector<int>& replicas);

/// Builds a plan from given stages (task lists in pipeline order) and replicas per stage (one
/// pipeline replica's devices; pipeline_replicas = world_size / Σ replicas, must divide). When
/// options.microbatches is 0, tries M = 1, 2, 4, … up to max_microbatches (and the per-copy batch)
/// and keeps the fastest plan that fits memory. Validates the result. Throws partrain::Error when
/// the plan cannot fit, naming the device memory it would need. Interleaved schedule with
/// options.virtual_stages = v: `stage_tasks` are the S·v model chunks and `replicas` one count per
/// chunk (equal on the chunks of a pipeline stage); only M that are multiples of S are tried.
Plan plan_from_stages(const Graph& graph, std::vector<std::vector<int>> stage_tasks, std::vector<int> replicas,
                      const CostModel& cost, const PlannerOptions& options, const std::string& planner);

/// Makes a plan's stages keep every loss piece (an activation without a batch dimension, e.g. one
/// head's cross-entropy) away from boundaries between stages of different replica counts, which
/// cannot split it by samples (Plan::validate): each task computing such a value moves into the
/// first later stage that reads it (its batched inputs cross instead), until none is left; constant
/// tasks are re-attached and the moved stages' summaries renewed. Returns whether a task moved (the
/// caller then predicts the plan again). Throws partrain::Error when a stage would be left empty.
bool move_loss_pieces_off_unequal_boundaries(const Graph& graph, Plan& plan);

/// Equal replicas for S stages over the world: world_size / S each when S divides it, else 1 per
/// stage and world_size / S pipeline replicas when S divides that way; throws partrain::Error otherwise.
std::vector<int> equal_replicas(int world_size, int stage_count);

}  // namespace partrain::partition
