#pragma once
// PlannerOptions: what every planner is asked (devices, batch, schedule, memory margin) and the
// knobs of each planner. A leaf of partition/: the planners in the paper folders take it without
// including the dispatcher (partition/planner.h).
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "partition/common/cost_model.h"
#include "plan/plan.h"

namespace partrain::partition {

class CapslogMeasurements;  // partition/capslog/capslog_profiling.h
class SegmentedRecomputationCache;  // partition/common/recomputation.h

/// What make_plan and make_3d_plan are asked: the devices, batch, schedule and memory margin every
/// planner honours, and the knobs of the individual planners (named after them).
struct PlannerOptions {
  std::string planner = "rannc";
  int world_size = 1;                    // devices to plan for
  /// Tensor-parallel degree t: the graph is tensor_parallel_graph(model, t) (per-rank costs and
  /// memory) and the planners lay out world_size / t groups of t ranks as if each were one device.
  /// make_plan takes t from the graph it is given (tensor_parallel_degree); make_3d_plan builds
  /// that graph: for this t, or for each t it tries when 0 (the planner chooses).
  int tensor_parallel = 1;
  /// ZeRO stage 0 or 1: with 1 the optimizer state counts once per stage's data-parallel group
  /// (divided by its size) in every stage's memory. make_3d_plan tries 0 and 1 when −1.
  int zero = 0;
  bool sub_pipelined_tmp = false;        // Merak §6.3, recorded in the plan (tensor_parallel > 1)
  /// Sequence parallelism (Korthikanti et al. 2022 §4.2.2): the graphs of t > 1 are
  /// tensor_parallel_graph(model, t, true); recorded in the plan (tensor_parallel > 1).
  bool sequence_parallel = false;
  /// make_3d_plan tries every t > 1 with and without sequence parallelism and keeps the faster
  /// (`[parallel] sequence_parallel = "auto"`); sequence_parallel is then ignored.
  bool choose_sequence_parallel = false;
  std::int64_t global_batch = 8;         // samples per optimizer step
  int microbatches = 0;                  // per step and pipeline replica; 0: the planner chooses
  ScheduleKind schedule = ScheduleKind::OneForwardOneBackward;
  /// `[parallel] schedule = "auto"`: make_plan plans with 1f1b and with zb_h1 and keeps the plan of
  /// the shorter predicted step among those that fit (schedule is then ignored).
  bool choose_schedule = false;
  /// Interleaved schedule: model chunks per pipeline rank v (Narayanan et al. SC'21 §2.2). The
  /// manual and uniform planners lay out S·v chunks (`stages` and `replicas` count pipeline stages,
  /// `boundaries` chunks); the other planners need 1.
  int virtual_stages = 1;
  /// auto (per stage the cheapest of none, selective, layers and boundaries that fits memory), none,
  /// boundaries, stage_aware, layers or selective (docs/parallelism.md §Activation recomputation).
  std::string recompute = "auto";
  int recompute_layers = 1;              // layers: transformer layers per checkpointed block (≥ 1)
  double memory_margin = 0.1;            // usable memory = device memory × (1 − margin)
  std::string optimizer = "adamw";       // recorded in the plan; its state copies count in memory
  int optimizer_state_copies = 2;        // AdamW 2, SGD 1 (state_copies_of_optimizer)
  bool mixed_precision = false;          // bf16 or fp16 mixed precision (recorded in the plan)
  bool fp16 = false;                     // with mixed_precision: fp16 (loss-scaled) rather than bf16
  /// > 0: the data-parallel all-reduce runs in buckets of this many bytes, each starting when its
  /// gradients are complete in the last backward, overlapping it (NCCL on its own stream; the plan
  /// records the overlap, PlanStage::allreduce_hidden_seconds); 0: priced after the backward.
  double overlap_bucket_bytes = 0;
  int blocks = 32;                       // RaNNC block count k
  /// make_3d_plan with rannc: a model with more layers than `blocks` gets its best layout planned
  /// again at one block per layer (at most 2 × blocks), kept when faster (block refinement, issue 25).
  bool refine_blocks = true;
  int max_microbatches = 64;             // RaNNC Algorithm 2: microbatch doubling bound
  std::size_t max_ideals = 200000;       // ideals planner
  double ip_time_limit_seconds = 60.0;   // ip planner: MIP search per device count tried
  double ip_relative_gap = 1e-4;         // ip planner: relative gap to stop at
  bool ip_contiguous = true;             // ip planner: false (non-contiguous splits) cannot make a Plan
  int stages = 0;                        // uniform / merak / manual: stage count; 0: planner's choice
  std::vector<std::int64_t> replicas;    // manual: replicas per stage
  std::vector<std::string> boundaries;   // manual: first layer of stages 2..S
  /// capslog: the peaks of trimmed profiling runs measured on the ranks (capslog_profiling.h); the
  /// planner reads them and requests there the jobs it lacks (priced analytically meanwhile).
  /// Null: every profiling peak is analytic (profiling off, `partrain plan`). Not owned.
  CapslogMeasurements* capslog_measurements = nullptr;
  /// rannc under recompute = "auto": the per-range segments of selective and per-layer recomputation,
  /// shared by the layouts make_3d_plan plans on one graph (both ZeRO settings, block refinement).
  /// Null: each search keeps its own. Not owned.
  SegmentedRecomputationCache* recomputation_cache = nullptr;
  /// Called with the fraction done (0..1) during long searches (progress bar); may be empty.
  std::function<void(double)> progress;
  /// rannc: when no plan fits, work out the smallest memory and device count that would (slow on
  /// large graphs); off, the error only says that nothing fits (make_3d_plan's candidates).
  bool diagnose_infeasible = true;
  /// rannc: only plans whose stage-DP objective, the step time (M + S − 1) · largest stage time +
  /// largest all-reduce (stage_dp.h), is below this are of interest (seconds): the DP prunes with it
  /// and, finding none, rannc says so without refining its blocks. make_3d_plan passes the best
  /// objective of the layouts found so far; infinity: no bound.
  double step_seconds_bound = std::numeric_limits<double>::infinity();
  /// rannc with schedule = "interleaved" and virtual_stages = 0 (it chooses v): when not null, set
  /// to the stage-DP objective (make_3d_plan's, of the predicted stages) of the plain 1F1B plan it
  /// found, infinity when none beat step_seconds_bound, whichever plan it returns (untouched
  /// otherwise). When the plan returned is interleaved, make_3d_plan bounds the later layouts with
  /// it rather than with that plan's objective, so that choosing v prunes no plain plan that
  /// planning without interleaving would find. Not owned.
  double* plain_objective_seconds = nullptr;

  /// usable bytes per device
  double usable_memory_bytes(const DeviceSpec& device) const { return device.memory_bytes * (1.0 - memory_margin); }
};

}  // namespace partrain::partition
