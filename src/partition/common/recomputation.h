#pragma once
// Activation recomputation in the planners (docs/parallelism.md §Activation recomputation): what a
// recompute policy costs a stage — the forward work its backward repeats and the activation memory
// it keeps — and, under recompute = "auto", the choice per stage of the policy that repeats the
// least work and fits memory (Korthikanti et al. 2022 §5: selective recomputation first, full
// per-layer recomputation where memory demands it; RaNNC's whole-stage recomputation last).
#include <cstdint>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "partition/common/planner_options.h"
#include "plan/plan.h"
#include "profile/memory_model.h"

namespace partrain::partition {

/// A stage's figures under its recompute policy, for one microbatch of the per-replica size.
struct StageRecomputation {
  double recompute_seconds = 0;        // forward work the backward repeats
  bool before_backward = false;        // boundaries / stage_aware: a Recompute action (MemoryPolicy::recompute)
  double kept_activation_bytes = 0;    // stage_aware: the saved tensors of the kept suffix
  bool segmented = false;              // layers / selective (MemoryPolicy::segmented)
  double checkpoint_bytes = 0;         // segmented: kept per microbatch in flight
  double recomputed_peak_bytes = 0;    // segmented: the largest segment's recomputed saved tensors

  /// Writes these figures into `policy` (recompute, kept_activation_bytes, segmented, ...).
  void apply_to(profile::MemoryPolicy& policy) const;
};

/// The figures of `stage` (its tasks, recompute, recompute_layers, recompute_until_task) at
/// `batch` samples: `whole` is cost.measure(stage.tasks, batch). Segmented policies count bytes
/// with activation_bytes_of (`mixed_precision`: bf16 activations) and the repeated forward with
/// cost.measure over the recomputed tasks; boundaries repeats whole.forward_seconds.
StageRecomputation stage_recomputation(const Graph& graph, const CostModel& cost, const PlanStage& stage,
                                       std::int64_t batch, bool mixed_precision, const profile::Measurement& whole);

/// The memory policy of stage `stage` of `stage_count` (stage_memory_policy) with `recomputation`
/// applied: the microbatches in flight as the schedule holds them with or without a Recompute action.
profile::MemoryPolicy recomputation_memory_policy(const PlannerOptions& options, int stage, int stage_count,
                                                  int microbatches, int data_parallel,
                                                  const StageRecomputation& recomputation);

/// recompute = "auto": sets plan stage `stage` (of `stage_count`)'s recompute (and
/// recompute_layers) to the first of none, selective, layers (every layer) and boundaries, in order
/// of the work they repeat, whose predicted memory fits `usable_bytes`; when none fits, the one of
/// least memory. `whole` is cost.measure(stage tasks, batch). Returns the chosen figures.
StageRecomputation choose_stage_recomputation(PlanStage& plan_stage, const Graph& graph, const CostModel& cost,
                                              const PlannerOptions& options, int stage, int stage_count,
                                              int microbatches, int data_parallel, std::int64_t batch,
                                              const profile::Measurement& whole, double usable_bytes);

}  // namespace partrain::partition
