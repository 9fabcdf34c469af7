#pragma once
// Entry point of planning on rank 0 and in `partrain plan`: options shared by every planner and the
// dispatch by name (rannc, ideals, dpl, capslog, merak, uniform, manual).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "partition/cost_model.h"
#include "plan/plan.h"

namespace partrain::partition {

struct PlannerOptions {
  std::string planner = "rannc";
  int world_size = 1;                    // devices to plan for
  /// Tensor-parallel degree t: the graph is tensor_parallel_graph(model, t) (per-rank costs and
  /// memory) and the planners lay out world_size / t groups of t ranks as if each were one device.
  int tensor_parallel = 1;
  /// ZeRO stage 0 or 1: with 1 the optimizer state counts once per stage's data-parallel group
  /// (divided by its size) in every stage's memory.
  int zero = 0;
  bool sub_pipelined_tmp = false;        // Merak §6.3, recorded in the plan (tensor_parallel > 1)
  std::int64_t global_batch = 8;         // samples per optimizer step
  int microbatches = 0;                  // per step and pipeline copy; 0: the planner chooses
  ScheduleKind schedule = ScheduleKind::OneForwardOneBackward;
  std::string recompute = "auto";        // auto (boundaries when S > 1), none, boundaries, stage_aware
  double memory_margin = 0.1;            // usable memory = device memory × (1 − margin)
  std::string optimizer = "adamw";       // recorded in the plan; its state copies count in memory
  int optimizer_state_copies = 2;        // AdamW 2, SGD 1 (state_copies_of_optimizer)
  bool mixed_precision = false;          // bf16 mixed precision (recorded in the plan)
  int blocks = 32;                       // RaNNC block count k
  int max_microbatches = 64;             // RaNNC Algorithm 2: microbatch doubling bound
  std::size_t max_ideals = 200000;       // ideals planner
  int stages = 0;                        // uniform / merak / manual: stage count; 0: planner's choice
  std::vector<std::int64_t> replicas;    // manual: replicas per stage
  std::vector<std::string> boundaries;   // manual: first layer of stages 2..S
  /// Called with the fraction done (0..1) during long searches (progress bar); may be empty.
  std::function<void(double)> progress;

  /// usable bytes per device
  double usable_memory_bytes(const DeviceSpec& device) const { return device.memory_bytes * (1.0 - memory_margin); }
};

/// Runs the named planner. Every planner returns a validated Plan with predictions filled in.
/// Throws partrain::Error for an unknown planner, or when no plan fits: the message names the
/// smallest device memory or device count that would work (when the planner can tell).
Plan make_plan(const Graph& graph, const CostModel& cost, const PlannerOptions& options);

}  // namespace partrain::partition
