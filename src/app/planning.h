#pragma once
// From an experiment file to planner inputs: the devices (DeviceSpec) and the PlannerOptions, shared
// by `partrain plan` and `partrain train` so both plan the same way.
#include <memory>
#include <string>
#include <unordered_map>

#include "core/tensor.h"
#include "graph/graph.h"
#include "io/config.h"
#include "partition/common/cost_model.h"
#include "profile/profile_db.h"
#include "partition/planner.h"
#include "plan/plan.h"
#include "runtime/runtime_options.h"

namespace partrain::app {

struct PlanningSetup {
  partition::DeviceSpec device;
  partition::PlannerOptions options;
};

/// The setup for `world_size` devices from [train] and [parallel]; `device_memory_bytes` > 0 and a
/// non-empty `planner` override the config. Throws partrain::Error on inconsistent values.
PlanningSetup planning_setup(const ExperimentConfig& config, int world_size, double device_memory_bytes = 0,
                             const std::string& planner = "");

/// Throws partrain::Error naming both values when `plan` (loaded from `plan_file`) was made for
/// another global batch, precision, optimizer or (when [train] microbatches is set) microbatch count
/// than `config` asks for: the plan's memory and time predictions hold only for what it recorded.
void check_plan_matches_config(const Plan& plan, const ExperimentConfig& config, const std::string& plan_file);

/// The graph a plan of tensor-parallel degree `tensor_parallel` indexes: the model of [model], and
/// for a degree above 1 its tensor_parallel_graph (graph/tensor_parallel.h). Throws partrain::Error
/// naming the config file and the [model] key (heads, hidden, intermediate, vocab) that the degree
/// does not divide, or saying that the model type has no tensor-parallel layers (resnet).
Graph planned_graph(const ExperimentConfig& config, int tensor_parallel);

/// The executor's initial parameters and buffers for rank `tensor_rank` of its tensor-parallel group:
/// the whole `model`'s initialisation from [train] seed (the same numbers under any plan), cut to the
/// rank's parts of `graph` (planned_graph: the model itself when not tensor parallel), by value id
/// of `graph`. Host tensors: a temporary the executor copies its stage's share from.
std::unordered_map<int, Tensor> initial_values(const ExperimentConfig& config, const Graph& model, const Graph& graph,
                                               int tensor_rank);

/// The errors of planned_graph for a degree, without building the graph (nothing for degree ≤ 1).
void check_tensor_parallel(const ExperimentConfig& config, int tensor_parallel);

/// The cost model the planner prices `graph` with: the calibrated model over `database` (the
/// graph's measured layers) when given, else the analytic model; both with setup's precision and
/// Merak's sub-pipelined TMP (setup.options.sub_pipelined_tmp). Throws what their makers throw.
std::unique_ptr<partition::CostModel> planning_cost_model(const PlanningSetup& setup, const Graph& graph,
                                                          const profile::ProfileDB* database);

/// Plans `model` (build_model(config.model)) in three dimensions with partition::make_3d_plan:
/// [parallel] tensor_parallel (0: the planner chooses) and zero (−1: the planner chooses) in
/// setup.options, the cost model of each candidate graph from `costs`. A fixed degree above 1 is
/// checked first (check_tensor_parallel: errors naming the [model] key). Throws what make_3d_plan
/// throws, e.g. when no layout fits.
partition::ThreeDimensionalPlan plan_experiment(const ExperimentConfig& config, const Graph& model,
                                                const PlanningSetup& setup, const partition::CostModelFactory& costs);

/// Training FLOPs of one sample of the whole model: 3 × the forward FLOPs of its batch-dependent
/// tasks (backward ≈ 2 × forward), without recomputation.
double training_flops_per_sample(const Graph& model);

/// What the plan's prediction means per device: "predicted: X TFLOP/s per device (MFU Y % of
/// [parallel] device_flops = Z TFLOP/s); W TFLOP/s with recomputation" — model FLOPs of `model`
/// (the whole model) × predicted samples/s / world size; recomputation adds the forward FLOPs of the
/// stages that recompute. Empty when the plan has no prediction.
std::string format_device_throughput(const Plan& plan, const Graph& model, const Graph& planned, double device_flops);

/// One line per layout make_3d_plan tried: t, zero, and the predicted samples/s with stages x
/// copies, or why it does not fit (first line of the reason), and the chosen one marked.
std::string format_layout_candidates(const partition::ThreeDimensionalPlan& result);

/// The executor's run settings from the [train] section (seed, optimizer hyper-parameters, learning
/// rate schedule, clipping) and [parallel] bucket_mb (default: 25 MiB). Throws partrain::Error for a
/// bad learning-rate schedule.
runtime::RuntimeOptions runtime_options(const TrainConfig& train, const ParallelConfig& parallel = {});

}  // namespace partrain::app
