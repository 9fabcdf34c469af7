#pragma once
// Entry point of planning on rank 0 and in `partrain plan`: options shared by every planner and the
// dispatch by name (rannc, ideals, dpl, ip, capslog, merak, uniform, manual).
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "partition/cost_model.h"
#include "plan/plan.h"

namespace partrain::partition {

class CapslogMeasurements;  // partition/capslog_profiling.h

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
  std::int64_t global_batch = 8;         // samples per optimizer step
  int microbatches = 0;                  // per step and pipeline copy; 0: the planner chooses
  ScheduleKind schedule = ScheduleKind::OneForwardOneBackward;
  /// Interleaved schedule: model chunks per pipeline rank v (Narayanan et al. SC'21 §2.2). The
  /// manual and uniform planners lay out S·v chunks (`stages` and `replicas` count pipeline stages,
  /// `boundaries` chunks); the other planners need 1.
  int virtual_stages = 1;
  std::string recompute = "auto";        // auto (boundaries when S > 1), none, boundaries, stage_aware
  double memory_margin = 0.1;            // usable memory = device memory × (1 − margin)
  std::string optimizer = "adamw";       // recorded in the plan; its state copies count in memory
  int optimizer_state_copies = 2;        // AdamW 2, SGD 1 (state_copies_of_optimizer)
  bool mixed_precision = false;          // bf16 mixed precision (recorded in the plan)
  int blocks = 32;                       // RaNNC block count k
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

  /// usable bytes per device
  double usable_memory_bytes(const DeviceSpec& device) const { return device.memory_bytes * (1.0 - memory_margin); }
};

/// Runs the named planner on `graph`, whose tensor-parallel degree t = tensor_parallel_degree(graph)
/// the plan records: the planner lays out world_size / t groups of t consecutive ranks as devices
/// (a node holds devices_per_node / t of them) and the plan's stages index `graph`. Every planner
/// returns a validated Plan with predictions filled in. Throws partrain::Error for an unknown
/// planner, for options.tensor_parallel > 1 that is not the graph's degree, for a t that does not
/// divide the world size, or when no plan fits: the message names the smallest device memory or
/// device count that would work (when the planner can tell).
///
/// rannc refines its blocks instead of giving up (issue 13): a block that cannot fit on one device
/// even alone (recomputation, one microbatch in flight, one sample) is split in two, recursively,
/// and when the stage DP still finds no split the block count is doubled (up to 3 times, at most
/// one block per atomic component) before "no plan fits".
Plan make_plan(const Graph& graph, const CostModel& cost, const PlannerOptions& options);

/// Makes the cost model of a graph (the model or one of its tensor_parallel_graphs); the graph
/// outlives the model.
using CostModelFactory = std::function<std::unique_ptr<CostModel>(const Graph& graph)>;

/// One (t, zero) layout make_3d_plan tried.
struct LayoutCandidate {
  int tensor_parallel = 1;
  int zero = 0;
  bool feasible = false;
  double samples_per_second = 0;  // the plan's prediction when feasible
  int stages = 0;                 // the plan's stages and pipeline copies when feasible
  int pipeline_copies = 0;
  std::string problem;            // why not, when not feasible
  double planning_seconds = 0;    // wall time of this candidate (graph, cost model and planner)
};

/// The plan make_3d_plan chose and the graph its stages index.
struct ThreeDimensionalPlan {
  Plan plan;
  Graph graph;                              // tensor_parallel_graph(model, plan.tensor_parallel) (the model for t = 1)
  std::vector<LayoutCandidate> candidates;  // every layout tried, in the order tried
};

/// The tensor-parallel degrees make_3d_plan tries for `model` on `device`: options.tensor_parallel
/// when it is positive, else each t ∈ {1, 2, 4, 8} with t ≤ devices_per_node that divides the
/// world size and for which tensor_parallel_graph(model, t) exists (t divides heads, hidden,
/// intermediate and vocabulary size; the model has tensor-parallel layers). Always holds 1 in the
/// automatic case.
std::vector<int> tensor_parallel_candidates(const Graph& model, const DeviceSpec& device, const PlannerOptions& options);

/// Planning in three dimensions (DESIGN.md "Parallelism in three dimensions"; Merak §3.2, issue 13):
/// for every tensor-parallel degree of tensor_parallel_candidates and every ZeRO stage (options.zero,
/// or 0 and 1 when it is −1), builds tensor_parallel_graph(model, t), its cost model from `costs`,
/// and runs make_plan (pipeline stages × replicas × microbatches) on world_size / t groups; keeps
/// the plan with the highest predicted samples per second that fits the memory (ties: smaller t,
/// then zero 0). Degrees are tried from the largest down, and the best stage-DP objective found so
/// far bounds rannc's search of the later candidates (PlannerOptions::step_seconds_bound): a layout
/// whose DP objective cannot beat it is reported as such and not planned further. This is RaNNC's
/// own ranking of configurations (Algorithm 2) carried across layouts; the simulated step time that
/// chooses among the surviving plans may rank two layouts otherwise in rare cases. Progress goes to
/// options.progress over the whole search. Throws partrain::Error
/// when no (tensor_parallel, stages, replicas, zero) layout fits, with each candidate's reason, and
/// when the degree asked for does not apply to the model (naming heads/hidden/intermediate/vocab).
ThreeDimensionalPlan make_3d_plan(const Graph& model, const CostModelFactory& costs, const PlannerOptions& options);

}  // namespace partrain::partition
