#include "app/planning.h"

#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "io/device_presets.h"
#include "models/model.h"
#include "partition/common/calibrated_cost_model.h"

namespace partrain::app {

partition::KernelModel kernel_model_of(const ParallelConfig& parallel, const std::string& precision) {
  const DevicePreset* preset = find_device_preset(parallel.device_model);
  PARTRAIN_CHECK(preset, "[parallel] device_model = \"" << parallel.device_model << "\" is not a known GPU");
  partition::KernelModel kernels;
  // device_flops and device_efficiency default to the preset's bf16 peak and GEMM efficiency; a
  // file that sets them changes the GEMM rate (fp16's tensor-core peak is bf16's on these GPUs).
  // fp32 plans run on the fp32 units.
  kernels.peak_flops = precision != "fp32" ? parallel.device_flops : preset->peak_fp32_flops;
  kernels.gemm_efficiency = parallel.device_efficiency;
  kernels.memory_bandwidth = preset->memory_bandwidth;
  kernels.memory_efficiency = preset->memory_efficiency;
  kernels.multiprocessors = preset->multiprocessors;
  kernels.kernel_seconds = preset->kernel_seconds;
  return kernels;
}

PlanningSetup planning_setup(const ExperimentConfig& config, int world_size, double device_memory_bytes,
                             const std::string& planner) {
  PARTRAIN_CHECK(world_size > 0, "the world size must be positive, not " << world_size);
  const ParallelConfig& parallel = config.parallel;
  PlanningSetup setup;
  setup.device.flops_per_second = parallel.device_flops * parallel.device_efficiency;
  setup.device.link_latency = parallel.link_latency;
  setup.device.memory_bytes = device_memory_bytes > 0 ? device_memory_bytes : parallel.device_memory_bytes;
  setup.device.link_bandwidth = parallel.link_bandwidth;
  setup.device.network_bandwidth = parallel.network_bandwidth;
  setup.device.devices_per_node = static_cast<int>(parallel.devices_per_node);
  if (!parallel.device_model.empty()) setup.device.kernels = kernel_model_of(parallel, config.train.precision);

  partition::PlannerOptions& options = setup.options;
  options.planner = planner.empty() ? parallel.planner : planner;
  options.world_size = world_size;
  options.tensor_parallel = static_cast<int>(parallel.tensor_parallel);
  options.zero = static_cast<int>(parallel.zero);
  if (parallel.devices_per_node > 1 && (!parallel.tensor_parallel_given || !parallel.zero_given)) {
    const std::string unset = !parallel.tensor_parallel_given && !parallel.zero_given ? "tensor_parallel and zero"
                              : !parallel.tensor_parallel_given                      ? "tensor_parallel"
                                                                                     : "zero";
    if (!parallel.device_model.empty()) {
      // Planning GPUs: Megatron-LM's space (t inside a node, ZeRO) is searched unless fixed.
      if (!parallel.tensor_parallel_given) options.tensor_parallel = 0;
      if (!parallel.zero_given) options.zero = -1;
      setup.layout_note = unset + " not set: searched for the " + parallel.device_model +
                          " devices (set them in [parallel] to fix a layout)";
    } else {
      setup.layout_note = unset + " not set: kept at " +
                          (unset == "zero" ? "0" : unset == "tensor_parallel" ? "1" : "1 and 0") +
                          " because without a GPU device_model the 3D search is opt-in (on CPUs the measured all-reduce "
                          "fits price t > 1 too cheaply, docs/parallelism.md); set \"auto\" to search";
    }
  }
  options.sub_pipelined_tmp = parallel.sub_pipelined_tmp;
  options.sequence_parallel = parallel.sequence_parallel;
  options.choose_sequence_parallel = parallel.choose_sequence_parallel;
  options.global_batch = config.train.global_batch;
  options.microbatches = static_cast<int>(config.train.microbatches);
  options.choose_schedule = parallel.schedule == "auto";
  options.schedule = options.choose_schedule ? ScheduleKind::OneForwardOneBackward : parse_schedule(parallel.schedule);
  options.virtual_stages = static_cast<int>(parallel.virtual_stages);
  options.recompute = parallel.recompute;
  options.recompute_layers = static_cast<int>(parallel.recompute_layers);
  options.memory_margin = parallel.memory_margin;
  options.optimizer = config.train.optimizer;
  options.optimizer_state_copies = state_copies_of_optimizer(config.train.optimizer);
  options.mixed_precision = config.train.precision != "fp32";
  options.fp16 = config.train.precision == "fp16";
  // On GPUs NCCL runs the bucketed all-reduce on its own stream, overlapping the last backward.
  if (!parallel.device_model.empty()) options.overlap_bucket_bytes = parallel.bucket_mb * (1 << 20);
  options.blocks = static_cast<int>(parallel.blocks);
  options.refine_blocks = !parallel.blocks_given;  // a block count the file sets is the one planned
  options.max_microbatches = static_cast<int>(parallel.max_microbatches);
  options.max_ideals = static_cast<std::size_t>(parallel.max_ideals);
  options.ip_time_limit_seconds = parallel.ip_time_limit;
  options.ip_relative_gap = parallel.ip_gap;
  options.ip_contiguous = parallel.ip_contiguous;
  options.stages = static_cast<int>(parallel.stages);
  options.replicas = parallel.replicas;
  options.boundaries = parallel.boundaries;
  return setup;
}

void check_plan_matches_config(const Plan& plan, const ExperimentConfig& config, const std::string& plan_file) {
  const TrainConfig& train = config.train;
  PARTRAIN_CHECK(plan.global_batch == train.global_batch,
                 plan_file << " was made for a global batch of " << plan.global_batch << ", but " << config.path
                           << " sets [train] global_batch = " << train.global_batch);
  PARTRAIN_CHECK(precision_name(plan.precision) == train.precision,
                 plan_file << " was made for precision " << precision_name(plan.precision) << ", but "
                           << config.path << " sets [train] precision = \"" << train.precision << "\"");
  PARTRAIN_CHECK(plan.optimizer == train.optimizer,
                 plan_file << " was made for optimizer " << plan.optimizer << ", but " << config.path
                           << " sets [train] optimizer = \"" << train.optimizer << "\"");
  PARTRAIN_CHECK(plan.tensor_parallel == 1 || config.parallel.choose_sequence_parallel ||
                     plan.sequence_parallel == config.parallel.sequence_parallel,
                 plan_file << " was made " << (plan.sequence_parallel ? "with" : "without") << " sequence parallelism, but "
                           << config.path << " sets [parallel] sequence_parallel = "
                           << (config.parallel.sequence_parallel ? "true" : "false"));
  PARTRAIN_CHECK(train.microbatches == 0 || train.microbatches == plan.microbatches,
                 plan_file << " was made for " << plan.microbatches << " microbatches, but " << config.path
                           << " sets [train] microbatches = " << train.microbatches);
}

PlannedGraphs::PlannedGraphs(const ExperimentConfig& config) : config_(config), model_(build_model(config.model)) {}

const Graph& PlannedGraphs::of_degree(int tensor_parallel, bool sequence_parallel) {
  if (tensor_parallel == 1) return model_;
  const std::pair<int, bool> key{tensor_parallel, sequence_parallel};
  auto found = parallel_.find(key);
  if (found != parallel_.end()) return found->second;
  check_tensor_parallel(config_, tensor_parallel, sequence_parallel);
  return parallel_.emplace(key, tensor_parallel_graph(model_, tensor_parallel, sequence_parallel)).first->second;
}

partition::TensorParallelGraphs PlannedGraphs::provider() {
  return [this](int tensor_parallel, bool sequence_parallel) -> const Graph& {
    return of_degree(tensor_parallel, sequence_parallel);
  };
}

void check_tensor_parallel(const ExperimentConfig& config, int tensor_parallel, bool sequence_parallel) {
  if (tensor_parallel <= 1) return;
  const ModelConfig& model = config.model;
  PARTRAIN_CHECK(model.type != "resnet", config.path << ": [parallel] tensor_parallel = " << tensor_parallel
                                                     << ", but a resnet has no tensor-parallel layers (only BERT and GPT "
                                                        "transformer layers split across ranks); use 1");
  // Not the vocabulary: the graph pads it to a multiple of vocab_divisible_by × t (Megatron-LM's way).
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"heads", model.heads}, {"hidden", model.hidden}, {"intermediate", model.intermediate_size()}};
  for (const auto& [key, size] : sizes)
    PARTRAIN_CHECK(size % tensor_parallel == 0, config.path << ": [model] " << key << " = " << size
                                                            << " is not a multiple of [parallel] tensor_parallel = "
                                                            << tensor_parallel);
  // Sequence parallelism splits the sequence over the group.
  PARTRAIN_CHECK(!sequence_parallel || model.seq_len % tensor_parallel == 0,
                 config.path << ": [model] seq_len = " << model.seq_len << " is not a multiple of [parallel] tensor_parallel = "
                             << tensor_parallel << " ([parallel] sequence_parallel = true splits the sequence over the group)");
}

std::unique_ptr<partition::CostModel> planning_cost_model(const PlanningSetup& setup, const Graph& graph,
                                                          const profile::ProfileDB* database) {
  if (database == nullptr)
    return partition::make_analytic_cost_model(graph, setup.device, setup.options.mixed_precision,
                                               setup.options.sub_pipelined_tmp);
  return partition::make_calibrated_cost_model(graph, *database, setup.device, setup.options.sub_pipelined_tmp);
}

partition::ThreeDimensionalPlan plan_experiment(const ExperimentConfig& config, PlannedGraphs& graphs,
                                                const PlanningSetup& setup, const partition::CostModelFactory& costs) {
  check_tensor_parallel(config, setup.options.tensor_parallel,
                        setup.options.sequence_parallel && !setup.options.choose_sequence_parallel);
  return partition::make_3d_plan(graphs.provider(), costs, setup.options);
}

double training_flops_per_sample(const Graph& model) {
  double flops = 0;
  for (const Task& task : model.tasks())
    if (!task.constant) flops += task.cost.forward_flops;
  return 3 * flops;
}

std::string format_device_throughput(const Plan& plan, const Graph& model, const Graph& planned, double device_flops) {
  const double samples = plan.predicted_samples_per_second();
  if (!(samples > 0) || plan.world_size <= 0) return "";
  const double model_flops = training_flops_per_sample(model) * samples / plan.world_size;
  // Recomputation repeats the forward of the tasks each stage's policy recomputes: their share of
  // the (per-rank) forward FLOPs of the planned graph.
  double all = 0, recomputed = 0;
  for (const PlanStage& stage : plan.stages) {
    for (int task : stage.tasks)
      if (!planned.task(task).constant) all += planned.task(task).cost.forward_flops;
    for (int task : recomputed_tasks(planned, stage))
      if (!planned.task(task).constant) recomputed += planned.task(task).cost.forward_flops;
  }
  const double hardware_flops = model_flops * (1.0 + (all > 0 ? recomputed / all : 0.0) / 3.0);
  char text[256];
  std::snprintf(text, sizeof text,
                "predicted: %.1f TFLOP/s per device (MFU %.1f%% of [parallel] device_flops = %.4g TFLOP/s); %.1f "
                "TFLOP/s with recomputation\n",
                model_flops / 1e12, 100.0 * model_flops / device_flops, device_flops / 1e12, hardware_flops / 1e12);
  return text;
}

std::string format_layout_candidates(const partition::ThreeDimensionalPlan& result) {
  std::ostringstream out;
  out << "layouts tried (tensor_parallel, zero):\n";
  // The chosen layout: the last feasible candidate of the plan's (t, zero, sequence parallelism)
  // with its samples/s (a block refinement may have replaced the first plan of that layout).
  std::size_t chosen_index = result.candidates.size();
  for (std::size_t i = 0; i < result.candidates.size(); ++i) {
    const partition::LayoutCandidate& candidate = result.candidates[i];
    if (candidate.feasible && candidate.tensor_parallel == result.plan.tensor_parallel &&
        candidate.zero == result.plan.zero &&
        candidate.sequence_parallel == (result.plan.tensor_parallel > 1 && result.plan.sequence_parallel) &&
        candidate.samples_per_second == result.plan.predicted_samples_per_second())
      chosen_index = i;
  }
  for (std::size_t i = 0; i < result.candidates.size(); ++i) {
    const partition::LayoutCandidate& candidate = result.candidates[i];
    const bool chosen = i == chosen_index;
    char head[64];
    std::snprintf(head, sizeof head, "  %s t=%d zero=%d%s", chosen ? "*" : " ", candidate.tensor_parallel, candidate.zero,
                  candidate.sequence_parallel ? " sp" : "");
    out << head;
    if (candidate.blocks > 0) {
      std::snprintf(head, sizeof head, " (refined: %d blocks)", candidate.blocks);
      out << head;
    }
    std::snprintf(head, sizeof head, ": ");
    out << head;
    if (candidate.feasible) {
      char chunks[48] = "";
      if (candidate.virtual_stages > 1)
        std::snprintf(chunks, sizeof chunks, " (interleaved, %d chunks per stage)", candidate.virtual_stages);
      char text[200];
      std::snprintf(text, sizeof text, "%.4g samples/s, %d stages%s x %d pipeline replicas (%.2f s)", candidate.samples_per_second,
                    candidate.stages, chunks, candidate.pipeline_replicas, candidate.planning_seconds);
      out << text;
    } else {
      const std::string first_line = candidate.problem.substr(0, candidate.problem.find('\n'));
      char text[32];
      std::snprintf(text, sizeof text, " (%.2f s)", candidate.planning_seconds);
      out << "no plan: " << first_line << text;
    }
    out << "\n";
  }
  return out.str();
}

std::unordered_map<int, Tensor> initial_values(const ExperimentConfig& config, const Graph& model, const Graph& graph,
                                               int tensor_rank) {
  return shard_values(model,
                      initialize_parameters(model, static_cast<std::uint64_t>(config.train.seed),
                                            config.model.initializer_range),
                      graph, tensor_rank);
}

runtime::LearningRateSchedule learning_rate_schedule(const TrainConfig& train) {
  return runtime::LearningRateSchedule(train.lr, train.min_lr, train.warmup_steps, train.steps,
                              runtime::LearningRateSchedule::parse_decay(train.lr_schedule));
}

runtime::RuntimeOptions runtime_options(const TrainConfig& train, const ParallelConfig& parallel) {
  runtime::RuntimeOptions options;
  options.seed = static_cast<std::uint64_t>(train.seed);
  options.optimizer.beta1 = train.beta1;
  options.optimizer.beta2 = train.beta2;
  options.optimizer.eps = train.eps;
  options.optimizer.weight_decay = train.weight_decay;
  options.optimizer.momentum = train.momentum;
  options.lr_schedule = learning_rate_schedule(train);
  options.grad_clip = train.grad_clip;
  options.loss_scaling = {train.initial_loss_scale, train.loss_scale_growth_factor, train.loss_scale_backoff_factor,
                          train.loss_scale_growth_interval, train.min_loss_scale};
  options.bucket_bytes = parallel.bucket_mb * (1 << 20);
  return options;
}

}  // namespace partrain::app
