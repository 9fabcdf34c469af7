#pragma once
// From an experiment file to planner inputs: the devices (DeviceSpec) and the PlannerOptions, shared
// by `partrain plan` and `partrain train` so both plan the same way.
#include <map>
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
  /// One line for the plan output when tensor_parallel and zero were not given in the file: that
  /// the planner searches them (a GPU device_model) or that they stay 1 and 0, and why. "" otherwise.
  std::string layout_note;
};

/// The kernel figures of [parallel] device_model (io/device_presets.h) for a run in `precision`
/// ("bf16": the tensor cores at device_flops × device_efficiency; "fp32": the fp32 units). Throws
/// partrain::Error for an unknown model.
partition::KernelModel kernel_model_of(const ParallelConfig& parallel, const std::string& precision);

/// The setup for `world_size` devices from [train] and [parallel]; `device_memory_bytes` > 0 and a
/// non-empty `planner` override the config. Throws partrain::Error on inconsistent values.
PlanningSetup planning_setup(const ExperimentConfig& config, int world_size, double device_memory_bytes = 0,
                             const std::string& planner = "");

/// Throws partrain::Error naming both values when `plan` (loaded from `plan_file`) was made for
/// another global batch, precision, optimizer, sequence parallelism (a plan of tensor_parallel > 1)
/// or (when [train] microbatches is set) microbatch count than `config` asks for: the plan's memory
/// and time predictions hold only for what it recorded.
void check_plan_matches_config(const Plan& plan, const ExperimentConfig& config, const std::string& plan_file);

/// The model of an experiment and the graph a plan of each tensor-parallel degree indexes, each
/// built once per process (the model at construction, a tensor-parallel graph when first asked
/// for) and handed to whoever needs it: profiling, planning, the plan's validation, the executor.
/// References stay valid as long as the PlannedGraphs does. Not thread-safe.
class PlannedGraphs {
 public:
  /// Builds the model of config.model (build_model); keeps a reference to `config`.
  explicit PlannedGraphs(const ExperimentConfig& config);
  PlannedGraphs(const PlannedGraphs&) = delete;
  PlannedGraphs& operator=(const PlannedGraphs&) = delete;

  /// The model of [model] (tensor-parallel degree 1).
  const Graph& model() const { return model_; }

  /// The graph of a plan of degree `tensor_parallel` (and Plan::sequence_parallel): the model for 1,
  /// else its tensor_parallel_graph(model, tensor_parallel, sequence_parallel)
  /// (graph/tensor_parallel.h), built the first time it is asked for. Throws what
  /// check_tensor_parallel throws for a degree the model does not allow.
  const Graph& of_degree(int tensor_parallel, bool sequence_parallel = false);

  /// of_degree as the planner's TensorParallelGraphs (partition/planner.h); `this` must outlive it.
  partition::TensorParallelGraphs provider();

 private:
  const ExperimentConfig& config_;
  Graph model_;
  // by (degree > 1, sequence parallel) (map nodes do not move: references stay valid)
  std::map<std::pair<int, bool>, Graph> parallel_;
};

/// The executor's initial parameters and buffers for rank `tensor_rank` of its tensor-parallel group:
/// the whole `model`'s initialisation from [train] seed (the same numbers under any plan), cut to the
/// rank's parts of `graph` (PlannedGraphs::of_degree: the model itself when not tensor parallel), by value id
/// of `graph`. Host tensors: a temporary the executor copies its stage's share from.
std::unordered_map<int, Tensor> initial_values(const ExperimentConfig& config, const Graph& model, const Graph& graph,
                                               int tensor_rank);

/// The one check of a tensor-parallel degree against the experiment, without building a graph
/// (nothing for degree ≤ 1): throws partrain::Error naming the config file and the [model] key
/// (heads, hidden, intermediate, vocab; seq_len with `sequence_parallel`) that the degree does not
/// divide, or saying that the model type has no tensor-parallel layers (resnet).
void check_tensor_parallel(const ExperimentConfig& config, int tensor_parallel, bool sequence_parallel = false);

/// The cost model the planner prices `graph` with: the calibrated model over `database` (the
/// graph's measured layers) when given, else the analytic model; both with setup's precision and
/// Merak's sub-pipelined TMP (setup.options.sub_pipelined_tmp). Throws what their makers throw.
std::unique_ptr<partition::CostModel> planning_cost_model(const PlanningSetup& setup, const Graph& graph,
                                                          const profile::ProfileDB* database);

/// Plans graphs.model() in three dimensions with partition::make_3d_plan, over the graphs of each
/// degree `graphs` keeps (each built once per process):
/// [parallel] tensor_parallel (0: the planner chooses) and zero (−1: the planner chooses) in
/// setup.options, the cost model of each candidate graph from `costs`. A fixed degree above 1 is
/// checked first (check_tensor_parallel: errors naming the [model] key). Throws what make_3d_plan
/// throws, e.g. when no layout fits.
partition::ThreeDimensionalPlan plan_experiment(const ExperimentConfig& config, PlannedGraphs& graphs,
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
/// pipeline replicas, or why it does not fit (first line of the reason), and the chosen one marked.
std::string format_layout_candidates(const partition::ThreeDimensionalPlan& result);

/// The learning-rate schedule of [train]: lr (peak), min_lr, warmup_steps, lr_schedule ("cosine",
/// "linear", "constant") and steps (where the decay reaches min_lr). Throws partrain::Error for an
/// unknown lr_schedule, negative rates, min_lr > lr or negative step counts.
runtime::LearningRateSchedule learning_rate_schedule(const TrainConfig& train);

/// The executor's run settings from the [train] section (seed, optimizer hyper-parameters, learning
/// rate schedule, clipping) and [parallel] bucket_mb (default: 25 MiB). Throws partrain::Error for a
/// bad learning-rate schedule.
runtime::RuntimeOptions runtime_options(const TrainConfig& train, const ParallelConfig& parallel = {});

}  // namespace partrain::app
