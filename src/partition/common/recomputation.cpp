#include "partition/common/recomputation.h"

#include <algorithm>
#include <limits>

#include "graph/activation_checkpointing.h"
#include "graph/saved_tensors.h"
#include "partition/common/plan_builder.h"
#include "plan/schedule.h"

namespace partrain::partition {

void StageRecomputation::apply_to(profile::MemoryPolicy& policy) const {
  policy.recompute = before_backward;
  policy.kept_activation_bytes = kept_activation_bytes;
  policy.segmented = segmented;
  policy.checkpoint_bytes = checkpoint_bytes;
  policy.recomputed_peak_bytes = recomputed_peak_bytes;
}

namespace {
// activation_bytes_of(values) as fixed + per_sample · batch (it is linear in the batch).
SegmentedRecomputation::LinearBytes linear_bytes(const Graph& graph, std::span<const int> values, bool mixed_precision) {
  const double one = activation_bytes_of(graph, values, 1, mixed_precision);
  const double two = activation_bytes_of(graph, values, 2, mixed_precision);
  return {2 * one - two, two - one};
}
}  // namespace

SegmentedRecomputation segmented_recomputation(const Graph& graph, const PlanStage& stage, bool mixed_precision) {
  SegmentedRecomputation structure;
  const std::vector<std::vector<int>> segments = recomputed_segments(graph, stage);
  std::vector<int> kept = saved_for_backward(graph, tasks_outside_segments(stage.tasks, segments));
  for (const std::vector<int>& segment : segments) {
    const std::vector<int> checkpoints = segment_checkpoints(graph, segment);
    kept.insert(kept.end(), checkpoints.begin(), checkpoints.end());
    structure.recomputed.insert(structure.recomputed.end(), segment.begin(), segment.end());
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  structure.kept = linear_bytes(graph, kept, mixed_precision);
  for (const std::vector<int>& segment : segments) {
    std::vector<int> extra;  // saved tensors the recomputation brings back (the kept ones stay)
    for (int value : saved_for_backward(graph, segment))
      if (!std::binary_search(kept.begin(), kept.end(), value)) extra.push_back(value);
    structure.recomputed_saved.push_back(linear_bytes(graph, extra, mixed_precision));
  }
  structure.repeats_work = std::any_of(structure.recomputed.begin(), structure.recomputed.end(),
                                       [&](int task) { return !graph.task(task).constant; });
  return structure;
}

std::size_t SegmentedRecomputationCache::KeyHash::operator()(const Key& key) const {
  std::size_t hash = std::hash<const Graph*>()(key.graph) ^ (static_cast<std::size_t>(key.policy) << 1) ^
                     (key.mixed_precision ? 0x9e3779b97f4a7c15ull : 0);
  for (int task : key.tasks) hash = hash * 1099511628211ull ^ static_cast<std::size_t>(task);
  return hash;
}

const SegmentedRecomputation& SegmentedRecomputationCache::get(const Graph& graph, const std::vector<int>& tasks,
                                                               RecomputePolicy policy, bool mixed_precision) {
  Key key{&graph, tasks, policy, mixed_precision};
  auto found = entries_.find(key);
  if (found != entries_.end()) return found->second;
  PlanStage stage;
  stage.tasks = tasks;
  stage.recompute = policy;
  return entries_.emplace(std::move(key), segmented_recomputation(graph, stage, mixed_precision)).first->second;
}

StageRecomputation segmented_recomputation_memory(const SegmentedRecomputation& structure, std::int64_t batch) {
  StageRecomputation figures;
  figures.segmented = true;
  figures.checkpoint_bytes = structure.kept.at(batch);
  for (const SegmentedRecomputation::LinearBytes& extra : structure.recomputed_saved)
    figures.recomputed_peak_bytes = std::max(figures.recomputed_peak_bytes, extra.at(batch));
  return figures;
}

StageRecomputation segmented_recomputation_figures(const CostModel& cost, const SegmentedRecomputation& structure,
                                                   std::int64_t batch) {
  StageRecomputation figures = segmented_recomputation_memory(structure, batch);
  if (structure.repeats_work) figures.recompute_seconds = cost.measure(structure.recomputed, batch).forward_seconds;
  return figures;
}

StageRecomputation stage_recomputation(const Graph& graph, const CostModel& cost, const PlanStage& stage,
                                       std::int64_t batch, bool mixed_precision, const profile::Measurement& whole) {
  StageRecomputation figures;
  switch (stage.recompute) {
    case RecomputePolicy::None:
      break;
    case RecomputePolicy::StageBoundaries:
      figures.before_backward = true;
      figures.recompute_seconds = whole.forward_seconds;
      break;
    case RecomputePolicy::StageAware: {
      figures.before_backward = true;
      std::vector<int> recomputed, kept;
      for (int task : stage.tasks) (task < stage.recompute_until_task ? recomputed : kept).push_back(task);
      figures.recompute_seconds = cost.measure(recomputed, batch).forward_seconds;
      figures.kept_activation_bytes = cost.measure(kept, batch).activation_bytes;
      break;
    }
    case RecomputePolicy::Layers:
    case RecomputePolicy::Selective:
      figures = segmented_recomputation_figures(cost, segmented_recomputation(graph, stage, mixed_precision), batch);
      break;
  }
  return figures;
}

profile::MemoryPolicy recomputation_memory_policy(const PlannerOptions& options, int stage, int stage_count,
                                                  int microbatches, int data_parallel,
                                                  const StageRecomputation& recomputation) {
  profile::MemoryPolicy policy = stage_memory_policy(options, stage, stage_count, microbatches, data_parallel);
  if (!schedule_has_chunks(options.schedule))  // interleaved and zb_v chunks: stage_memory_policy's count
    policy.microbatches_in_flight =
        microbatches_in_flight(options.schedule, stage, stage_count, microbatches, recomputation.before_backward);
  recomputation.apply_to(policy);
  return policy;
}

StageRecomputation choose_stage_recomputation(PlanStage& plan_stage, const Graph& graph, const CostModel& cost,
                                              const PlannerOptions& options, int stage, int stage_count,
                                              int microbatches, int data_parallel, std::int64_t batch,
                                              const profile::Measurement& whole, double usable_bytes) {
  struct Candidate {
    RecomputePolicy policy;
    StageRecomputation figures;
    double memory = 0;
  };
  std::vector<Candidate> candidates;
  for (RecomputePolicy policy : {RecomputePolicy::None, RecomputePolicy::Selective, RecomputePolicy::Layers,
                                 RecomputePolicy::StageBoundaries}) {
    PlanStage trial = plan_stage;
    trial.recompute = policy;
    trial.recompute_layers = 1;
    trial.recompute_until_task = -1;
    Candidate candidate{policy, stage_recomputation(graph, cost, trial, batch, options.mixed_precision, whole)};
    candidate.memory = profile::stage_memory_bytes(
        whole, recomputation_memory_policy(options, stage, stage_count, microbatches, data_parallel, candidate.figures));
    candidates.push_back(candidate);
  }
  // Least repeated work first (stable: ties keep the order above); the first that fits wins.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.figures.recompute_seconds < b.figures.recompute_seconds;
  });
  const Candidate* chosen = nullptr;
  for (const Candidate& candidate : candidates)
    if (candidate.memory <= usable_bytes) {
      chosen = &candidate;
      break;
    }
  if (chosen == nullptr)
    chosen = &*std::min_element(candidates.begin(), candidates.end(),
                                [](const Candidate& a, const Candidate& b) { return a.memory < b.memory; });
  plan_stage.recompute = chosen->policy;
  plan_stage.recompute_layers = 1;
  plan_stage.recompute_until_task = -1;
  return chosen->figures;
}

}  // namespace partrain::partition
