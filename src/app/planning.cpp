#include "app/planning.h"

#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "models/model.h"

namespace partrain::app {

PlanningSetup planning_setup(const ExperimentConfig& config, int world_size, double device_memory_bytes,
                             const std::string& planner) {
  PARTRAIN_CHECK(world_size > 0, "the world size must be positive, not " << world_size);
  const ParallelConfig& parallel = config.parallel;
  PlanningSetup setup;
  setup.device.flops_per_second = parallel.device_flops;
  setup.device.memory_bytes = device_memory_bytes > 0 ? device_memory_bytes : parallel.device_memory_bytes;
  setup.device.link_bandwidth = parallel.link_bandwidth;
  setup.device.network_bandwidth = parallel.network_bandwidth;
  setup.device.devices_per_node = static_cast<int>(parallel.devices_per_node);

  partition::PlannerOptions& options = setup.options;
  options.planner = planner.empty() ? parallel.planner : planner;
  options.world_size = world_size;
  options.tensor_parallel = static_cast<int>(parallel.tensor_parallel);
  options.zero = static_cast<int>(parallel.zero);
  options.sub_pipelined_tmp = parallel.sub_pipelined_tmp;
  options.global_batch = config.train.global_batch;
  options.microbatches = static_cast<int>(config.train.microbatches);
  options.schedule = parse_schedule(parallel.schedule);
  options.recompute = parallel.recompute;
  options.memory_margin = parallel.memory_margin;
  options.optimizer = config.train.optimizer;
  options.optimizer_state_copies = state_copies_of_optimizer(config.train.optimizer);
  options.mixed_precision = config.train.precision == "bf16";
  options.blocks = static_cast<int>(parallel.blocks);
  options.max_microbatches = static_cast<int>(parallel.max_microbatches);
  options.max_ideals = static_cast<std::size_t>(parallel.max_ideals);
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
  PARTRAIN_CHECK(train.microbatches == 0 || train.microbatches == plan.microbatches,
                 plan_file << " was made for " << plan.microbatches << " microbatches, but " << config.path
                           << " sets [train] microbatches = " << train.microbatches);
}

Graph planned_graph(const ExperimentConfig& config, int tensor_parallel) {
  Graph graph = build_model(config.model);
  if (tensor_parallel == 1) return graph;
  const ModelConfig& model = config.model;
  PARTRAIN_CHECK(model.type != "resnet", config.path << ": [parallel] tensor_parallel = " << tensor_parallel
                                                     << ", but a resnet has no tensor-parallel layers (only BERT and GPT "
                                                        "transformer layers split across ranks); use 1");
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"heads", model.heads}, {"hidden", model.hidden}, {"intermediate", model.intermediate_size()}, {"vocab", model.vocab}};
  for (const auto& [key, size] : sizes)
    PARTRAIN_CHECK(size % tensor_parallel == 0,
                   config.path << ": [model] " << key << " = " << size << " is not a multiple of [parallel] tensor_parallel = "
                               << tensor_parallel << (std::string(key) == "vocab" ? " (pad the vocabulary as Megatron does)" : ""));
  return tensor_parallel_graph(graph, tensor_parallel);
}

std::unordered_map<int, Tensor> initial_values(const ExperimentConfig& config, const Graph& model, const Graph& graph,
                                               int tensor_rank) {
  return shard_values(model,
                      initialize_parameters(model, static_cast<std::uint64_t>(config.train.seed),
                                            config.model.initializer_range),
                      graph, tensor_rank);
}

runtime::RuntimeOptions runtime_options(const TrainConfig& train) {
  runtime::RuntimeOptions options;
  options.seed = static_cast<std::uint64_t>(train.seed);
  options.optimizer.beta1 = train.beta1;
  options.optimizer.beta2 = train.beta2;
  options.optimizer.eps = train.eps;
  options.optimizer.weight_decay = train.weight_decay;
  options.optimizer.momentum = train.momentum;
  options.lr_schedule = LearningRateSchedule(train);
  options.grad_clip = train.grad_clip;
  return options;
}

}  // namespace partrain::app
