#pragma once
// Activation recomputation in the planners (docs/parallelism.md §Activation recomputation): what a
// recompute policy costs a stage — the forward work its backward repeats and the activation memory
// it keeps — and, under recompute = "auto", the choice per stage of the policy that repeats the
// least work and fits memory (Korthikanti et al. 2022 §5: selective recomputation first, full
// per-layer recomputation where memory demands it; RaNNC's whole-stage recomputation last).
#include <cstdint>
#include <unordered_map>
#include <vector>

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

/// Per-layer or selective recomputation of a stage, apart from the batch: each microbatch keeps the
/// segments' checkpoints and the saved tensors of the tasks outside them; one segment at a time
/// holds its saved tensors again while its backward runs. Bytes are linear in the batch:
/// fixed + per_sample · batch (activation_bytes_of).
struct SegmentedRecomputation {
  struct LinearBytes {
    double fixed = 0, per_sample = 0;
    double at(std::int64_t batch) const { return fixed + per_sample * static_cast<double>(batch); }
  };
  LinearBytes kept;                         // values kept per microbatch in flight
  std::vector<LinearBytes> recomputed_saved;  // per segment: the saved values it brings back
  std::vector<int> recomputed;              // the tasks the backward repeats
  bool repeats_work = false;                // some recomputed task is not constant
};

/// The segments of `stage` (stage.recompute Layers or Selective, recomputed_segments), what they
/// keep and bring back (bytes as activation_bytes_of counts them; `mixed_precision`: bf16
/// activations) and what they repeat.
SegmentedRecomputation segmented_recomputation(const Graph& graph, const PlanStage& stage, bool mixed_precision);

/// segmented_recomputation of task lists of graphs, kept: the same stage is looked at again for
/// every batch, ZeRO setting and block count a search tries. The graphs must outlive the cache.
class SegmentedRecomputationCache {
 public:
  /// segmented_recomputation(graph, stage with `tasks` (ascending) and `policy` (Layers or
  /// Selective, one layer per segment), mixed_precision), computed once.
  const SegmentedRecomputation& get(const Graph& graph, const std::vector<int>& tasks, RecomputePolicy policy,
                                    bool mixed_precision);

 private:
  struct Key {
    const Graph* graph;
    std::vector<int> tasks;
    RecomputePolicy policy;
    bool mixed_precision;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };
  std::unordered_map<Key, SegmentedRecomputation, KeyHash> entries_;
};

/// `structure`'s memory figures at `batch` samples (checkpoint bytes, the largest segment's
/// recomputed saved bytes), recompute_seconds left 0.
StageRecomputation segmented_recomputation_memory(const SegmentedRecomputation& structure, std::int64_t batch);

/// `structure`'s figures at `batch` samples: checkpoint bytes, the largest segment's recomputed
/// saved bytes and the repeated forward's seconds (cost.measure of the recomputed tasks).
StageRecomputation segmented_recomputation_figures(const CostModel& cost, const SegmentedRecomputation& structure,
                                                   std::int64_t batch);

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
