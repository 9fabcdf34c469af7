#pragma once
// The `manual` planner: stage boundaries and replicas written in the configuration ([parallel]
// boundaries, replicas).
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "plan/plan.h"
#include "partition/common/plan_builder.h"
#include "partition/common/planner_options.h"

namespace partrain::partition {

/// The [first, last) group ranges of the stages whose first layers are `boundaries` (names of
/// groups, the first layer of stages 2..S). Throws partrain::Error, naming the boundary, for a name
/// that is not a group ("[parallel] boundaries: 'encoder.layer.9' is not a layer of this model;
/// layers are: embeddings, encoder.layer.0, ..."), the first group (stage 1 would be empty), or a
/// boundary that does not come after the one before it (out of order or repeated).
std::vector<std::pair<std::size_t, std::size_t>> manual_stage_ranges(const std::vector<LayerGroup>& groups,
                                                                     const std::vector<std::string>& boundaries);

/// The `manual` planner: stages from manual_stage_ranges(layer_groups(graph),
/// options.boundaries) — S = boundaries + 1; options.stages, when set, must equal it — with
/// options.replicas[s] devices for stage s (all 1 when empty); pipeline replicas = world size / Σ
/// replicas. Microbatches, predictions and the memory check by plan_from_stages. Throws
/// partrain::Error (messages start with "[parallel]") for bad boundaries, a replicas list whose
/// length is not S or with a value < 1, Σ replicas not dividing the world size, a stage count
/// mismatch, or a plan that does not fit the device memory. Interleaved schedule with
/// options.virtual_stages = v: the boundaries cut S·v model chunks (S·v − 1 boundaries), chunk c on
/// pipeline stage c mod S, replicas per pipeline stage (S values).
Plan plan_manual(const Graph& graph, const CostModel& cost, const PlannerOptions& options);

}  // namespace partrain::partition
