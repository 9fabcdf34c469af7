// partrain inspect: a summary of a model built from an experiment file (parameter counts, tasks,
// values, FLOPs, a per-layer table), or of a checkpoint (.h5: step, progress, optimizer, every
// tensor with its shape, parameter count, the config it was trained with).
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "app/commands.h"
#include "graph/graph.h"
#include "graph/layer_names.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "models/model.h"

namespace partrain::app {

namespace {

struct LayerSummary {
  std::int64_t parameters = 0;
  int tasks = 0;
  double forward_flops = 0;
};

int inspect_checkpoint(const std::string& path) {
  const io::CheckpointSummary summary = io::summarize_checkpoint(path);
  const io::CheckpointInfo& info = summary.info;
  std::printf("checkpoint: %s (format %lld)\n", path.c_str(), static_cast<long long>(info.format_version));
  std::printf("step: %lld\nconsumed_samples: %lld\ndata_cursor: %lld\nseed: %llu\noptimizer: %s\n",
              static_cast<long long>(info.step), static_cast<long long>(info.consumed_samples),
              static_cast<long long>(info.data_cursor), static_cast<unsigned long long>(info.seed),
              info.optimizer.c_str());
  if (info.loss_scale > 0)  // an fp16 run's loss scaler
    std::printf("loss_scale: %g\nloss_scale_good_steps: %lld\n", info.loss_scale,
                static_cast<long long>(info.loss_scale_good_steps));
  std::int64_t parameters = 0;
  std::printf("%-70s %s\n", "tensor", "shape");
  for (const auto& [name, shape] : summary.tensors) {
    std::printf("%-70s %s\n", name.c_str(), shape_string(shape).c_str());
    if (name.starts_with("model/") && !name.ends_with("running_mean") && !name.ends_with("running_var")) parameters += numel(shape);
  }
  std::printf("tensors: %zu\nmodel_elements: %lld\n", summary.tensors.size(), static_cast<long long>(parameters));
  std::printf("config:\n%s\n", info.config_toml.c_str());
  return 0;
}

}  // namespace

int run_inspect(const InspectArguments& arguments) {
  if (arguments.file.ends_with(".h5")) return inspect_checkpoint(arguments.file);
  const ExperimentConfig config = load_experiment(arguments.file, arguments.overrides);
  const Graph graph = build_model(config.model);

  // Group parameters and tasks by layer, keeping the order in which layers first appear.
  std::vector<std::string> order;
  std::map<std::string, LayerSummary> layers;
  auto layer = [&](const std::string& name) -> LayerSummary& {
    const std::string key = layer_of(name);
    if (!layers.count(key)) order.push_back(key);
    return layers[key];
  };
  double forward_flops = 0;
  for (const Task& task : graph.tasks()) {
    LayerSummary& summary = layer(task.name);
    ++summary.tasks;
    summary.forward_flops += task.cost.forward_flops;
    forward_flops += task.cost.forward_flops;
  }
  for (const int id : graph.parameters()) layer(graph.value(id).name).parameters += numel(graph.value(id).type.shape);

  std::printf("model: %s (%s)\n", config.model.type.c_str(), arguments.file.c_str());
  std::printf("parameters: %lld\n", static_cast<long long>(graph.parameter_count()));
  std::printf("body_parameters: %lld\n", static_cast<long long>(body_parameter_count(graph)));
  std::printf("tasks: %zu\n", graph.tasks().size());
  std::printf("values: %zu\n", graph.values().size());
  std::printf("forward_flops_per_sample: %.6e\n", forward_flops);
  std::printf("\n%-22s %14s %7s %16s\n", "layer", "parameters", "tasks", "GFLOP/sample");
  for (const std::string& name : order) {
    const LayerSummary& summary = layers[name];
    std::printf("%-22s %14lld %7d %16.4f\n", name.c_str(), static_cast<long long>(summary.parameters), summary.tasks,
                summary.forward_flops / 1e9);
  }
  return 0;
}

}  // namespace partrain::app
