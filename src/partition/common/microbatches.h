#pragma once
// The microbatch count and size the layer-level planners capslog and merak balance
// their stages for, before plan_from_stages (plan_builder.h) chooses the final count.
#include <cstdint>
#include <vector>

#include "partition/common/planner_options.h"

namespace partrain::partition {

/// The microbatch count the layer-level planners balance their split for (the final count is chosen
/// by plan_from_stages): options.microbatches when set; otherwise the smallest power of two ≥ the
/// stage count and ≤ options.max_microbatches into which the global batch splits (over
/// world_size / Σ replicas pipeline replicas, with at least max(replicas) samples per microbatch);
/// otherwise the largest such power of two; 1 when none splits.
int planning_microbatches(const PlannerOptions& options, int stages, const std::vector<int>& replicas);

/// Samples of one microbatch that replica 0 of a stage with `stage_replicas` replicas handles (the
/// largest share): ⌈global_batch / (R · microbatches) / stage_replicas⌉, R (pipeline replicas) =
/// world_size / Σ replicas. At least 1.
std::int64_t replica_microbatch(const PlannerOptions& options, int stage_replicas, const std::vector<int>& replicas,
                                int microbatches);

}  // namespace partrain::partition
