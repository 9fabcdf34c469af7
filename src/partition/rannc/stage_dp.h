#pragma once
// RaNNC's stage-level partitioning (Tanaka et al., "Automatic Graph Partitioning for Very Large-scale
// Deep Learning", IPDPS 2021, §III-C): given k blocks in pipeline order (convex task sets, e.g. from
// partition/rannc/blocks), a dynamic program (Algorithm 1) chooses the stage boundaries and the number of
// data-parallel replicas of every stage that minimise the largest stage time under the device memory
// limit, and an outer search (Algorithm 2) chooses the number of nodes per pipeline, the number of
// stages and the number of microbatches that minimise the predicted step time.
//
// Times in seconds, sizes in bytes. Costs and memory are those of plan_builder's predict_plan, so the
// plans the DP ranks are the plans the runtime is predicted to run:
//   stage time  = (fwd + send outputs) + (bwd + receive inputs [+ the forward its recompute policy
//                 repeats]) at the per-replica microbatch ⌈microbatch / replicas⌉; under recompute =
//                 "auto" the policy is the first of none, selective, per-layer and boundaries that
//                 fits, per stage, as predict_plan chooses it (plan_stages_rannc; solve_stage_dp,
//                 which has no graph, prices boundaries there),
//   stage memory = stage_memory_bytes(measurement, stage_memory_policy(options, s, S, M)) with that
//                 policy's kept activations,
//   step time   = (M + S − 1) · max stage time + max stage all-reduce, the all-reduce less what the
//                 bucketed all-reduce hides under the last backward (options.overlap_bucket_bytes).
#include <cstdint>
#include <optional>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "plan/plan.h"
#include "partition/common/planner_options.h"

namespace partrain::partition {

/// One configuration of Algorithm 1: S stages on D devices per pipeline replica, R = world / D pipeline_replicas,
/// M microbatches per copy and step.
struct StageDpConfig {
  int stages = 1;        // S
  int devices = 1;       // D: devices of one pipeline replica (Σ replicas of the stages)
  int pipeline_replicas = 1;        // R: pipeline replicas (data parallel over whole pipelines)
  int microbatches = 1;  // M
};

/// What Algorithm 1 found for one configuration.
struct StageSplit {
  bool feasible = false;              // false: no split fits the memory (or the batch)
  double max_stage_seconds = 0;       // the DP's objective: the largest stage time
  double max_allreduce_seconds = 0;   // the largest stage gradient all-reduce of the chosen split
  double step_seconds = 0;            // (M + S − 1) · max_stage_seconds + max_allreduce_seconds
  std::vector<int> first_block;       // per stage: index of its first block (first_block[0] = 0)
  std::vector<int> replicas;          // per stage: replicas in one pipeline replica (Σ = devices)
};

/// RaNNC Algorithm 1 for one configuration: the split of blocks 0..k−1 into config.stages contiguous
/// stages and of config.devices devices over them (≥ 1 each) that minimises the largest stage time,
/// each stage fitting options.usable_memory_bytes(cost.device()). Exact (min-max DP over
/// V[s][b][d] = best placement of blocks ..b on d devices in s stages). Among splits of equal stage
/// time, one with a smaller all-reduce is preferred. The global batch must divide into
/// pipeline replicas × microbatches, and the microbatch must have at least as many samples as a stage has
/// replicas. Returns feasible = false when nothing fits; throws partrain::Error for bad arguments
/// (empty blocks, a non-positive count) or when the cost model cannot measure a block range.
StageSplit solve_stage_dp(const std::vector<std::vector<int>>& blocks, const CostModel& cost,
                          const PlannerOptions& options, const StageDpConfig& config);

/// RaNNC Algorithm 1 as the paper prints it (§III-C, lines 8–36) for one configuration with S ≥ 2
/// stages: a placement is scored by its largest stage forward plus its largest stage backward,
/// kept apart (max_stage_seconds holds that sum), ties going to the smaller all-reduce. The sum is
/// not a min-max objective, so this is the paper's heuristic, not an exact optimum; without the
/// dmin rule (lines 30–33). Returns feasible = false when nothing fits, for S = 1, or when the
/// table would be too large (over 2·10⁸ stage evaluations); throws like solve_stage_dp.
StageSplit solve_stage_dp_phase_maxima(const std::vector<std::vector<int>>& blocks, const CostModel& cost,
                                       const PlannerOptions& options, const StageDpConfig& config);

/// The pipeline sizes Algorithm 2 tries: D = devices_per_node · n for whole nodes n dividing the
/// world, and D = world_size (a single pipeline replica) in any case; ascending.
std::vector<int> stage_dp_pipeline_sizes(int world_size, int devices_per_node);

/// The microbatch counts Algorithm 2 tries for `pipeline_replicas` pipeline replicas: M = 1, 2, 4, ...
/// ≤ options.max_microbatches (RaNNC's doubling), and the counts giving microbatches of a
/// power-of-two size (B / 1, B / 2, B / 4, ... for the B samples of a pipeline replica's step:
/// Megatron's microbatch of 1 at M = B, which powers of two alone miss when B is not one), ascending
/// and distinct. Only options.microbatches when set.
std::vector<int> stage_dp_microbatch_counts(const PlannerOptions& options, int pipeline_replicas);

/// RaNNC Algorithm 2 around Algorithm 1: for pipelines of n nodes (D = devices_per_node · n devices
/// with R = world_size / D pipeline_replicas; D = world_size when it is not a multiple of a node), every stage
/// count S ≤ min(k, D) (only options.stages when set), and microbatch counts M = 1, 2, 4, … ≤
/// options.max_microbatches plus those giving microbatches of a power-of-two size (B / 2^j for the
/// B = global batch / R samples of a copy's step, e.g. Megatron-LM's microbatch of 1 sample), with
/// the global batch dividing into R · M microbatches (only options.microbatches when set), keeps
/// the split with the least predicted step time. The
/// all-reduce term is handled exactly: Algorithm 1 is re-run with the largest stage all-reduce
/// capped below the previous optimum's until the step time cannot improve (at most 64 rounds per
/// configuration). For the configuration chosen, the split of the printed Algorithm 1
/// (solve_stage_dp_phase_maxima) replaces the exact one when the schedule's simulation predicts it
/// faster. Returns a validated Plan (planner "rannc": stages = unions of consecutive
/// blocks, replicas, pipeline_replicas, microbatches, predictions of predict_plan). Progress goes to
/// options.progress. With options.schedule interleaved and virtual_stages = 0 ("auto"), the DP plans
/// plain 1F1B pipelines and plan_interleaved_rannc (interleaving.h) the interleaved ones, bounded by
/// the best plain objective; the plan the schedule simulator predicts faster is returned (ties:
/// plain), with schedule 1f1b or interleaved and its virtual_stages. Throws partrain::Error when no plan fits: the message names the smallest device
/// memory that would fit and, when more devices would help, a device count that fits; or when the
/// global batch cannot be split, the blocks are malformed, or the cost model cannot measure a range.
Plan plan_stages_rannc(const Graph& graph, const std::vector<std::vector<int>>& blocks, const CostModel& cost,
                       const PlannerOptions& options);

/// plan_stages_rannc, but std::nullopt instead of the error when no split of these blocks fits the
/// memory (the caller may refine the blocks); other errors (a batch that cannot be split, malformed
/// blocks, a range the cost model cannot measure) still throw.
std::optional<Plan> try_plan_stages_rannc(const Graph& graph, const std::vector<std::vector<int>>& blocks,
                                          const CostModel& cost, const PlannerOptions& options);

}  // namespace partrain::partition
