// Megatron-LM's published layouts fit where they ran (issue 24 item 5): the GPT models of Narayanan
// et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21),
// Table 1 — 1.7B to 1T parameters, their tensor-parallel size t, pipeline size p, GPUs and global
// batch — planned on 80 GiB A100s with the cost model of configs/gpt3-175b.toml, under the full
// per-layer activation recomputation those runs used (recompute = "layers", one layer per
// checkpoint: Megatron's --recompute-method uniform --recompute-num-layers 1). Before per-layer
// checkpointing the memory model said these layouts need up to 261 GiB.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "graph/tensor_parallel.h"
#include "models/model.h"
#include "partition/common/cost_model.h"
#include "partition/planner.h"

namespace partrain {
namespace {

struct MegatronLayout {
  const char* name;
  std::int64_t heads, hidden, layers;
  int tensor_parallel, pipeline_stages, gpus;
  std::int64_t global_batch;
  /// Table 1 does not list microbatch sizes: 16 down to 4 samples for the models of one or two
  /// stages (data parallelism with gradient accumulation), 1 for the deep pipelines (as in
  /// configs/megatron-gpt3-175b-manual.toml).
  std::int64_t microbatch;
};

// Table 1 of Narayanan et al. SC'21 (vocabulary 51,200, sequence 2048).
const MegatronLayout kTableOne[] = {
    {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 16},
    {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 16},
    {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 16},
    {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8},
    {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4},
    {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 1},
    {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 1},
    {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1},
    {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1},
    {"1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 1},
};

Graph gpt_of(const MegatronLayout& layout) {
  ModelConfig config;
  config.type = "gpt";
  config.layers = layout.layers;
  config.hidden = layout.hidden;
  config.heads = layout.heads;
  config.vocab = 51200;
  config.max_position = 2048;
  config.seq_len = 2048;
  config.dropout = 0.1;
  return build_model(config);
}

// configs/gpt3-175b.toml's devices: A100 80 GiB, 312 TFLOP/s × 0.5, NVLink 300 GB/s, 25 GB/s
// between nodes of 8, 10 µs per collective.
partition::DeviceSpec a100() {
  partition::DeviceSpec device;
  device.flops_per_second = 312e12 * 0.5;
  device.memory_bytes = 80.0 * (1ull << 30);
  device.link_bandwidth = 300e9;
  device.network_bandwidth = 25e9;
  device.devices_per_node = 8;
  device.link_latency = 10e-6;
  return device;
}

Plan megatron_plan(const MegatronLayout& layout, const Graph& graph, const std::string& recompute) {
  partition::PlannerOptions options;
  options.planner = "uniform";
  options.world_size = layout.gpus;
  options.stages = layout.pipeline_stages;
  options.tensor_parallel = layout.tensor_parallel;
  options.global_batch = layout.global_batch;
  const int data_parallel = layout.gpus / (layout.tensor_parallel * layout.pipeline_stages);
  options.microbatches = static_cast<int>(layout.global_batch / (data_parallel * layout.microbatch));
  options.mixed_precision = true;
  options.recompute = recompute;
  options.memory_margin = 0;  // "fits 80 GiB": the whole device
  const auto cost = partition::make_analytic_cost_model(graph, a100(), /*mixed_precision=*/true);
  return partition::make_plan(graph, *cost, options);
}

double largest_stage_bytes(const Plan& plan) {
  double largest = 0;
  for (const PlanStage& stage : plan.stages) largest = std::max(largest, stage.memory_bytes);
  return largest;
}

TEST(MegatronLayouts, TableOneFitsEightyGibUnderPerLayerRecomputation) {
  for (const MegatronLayout& layout : kTableOne) {
    const Graph model = gpt_of(layout);
    const Graph graph = layout.tensor_parallel > 1 ? tensor_parallel_graph(model, layout.tensor_parallel) : model;
    const Plan plan = megatron_plan(layout, graph, "layers");
    ASSERT_EQ(plan.pipeline_stages(), layout.pipeline_stages) << layout.name;
    EXPECT_EQ(plan.microbatch_size() / plan.stages[0].replicas, layout.microbatch) << layout.name;
    for (const PlanStage& stage : plan.stages) EXPECT_EQ(stage.recompute, RecomputePolicy::Layers) << layout.name;
    std::printf("%-7s t %d p %2d, %4d GPUs, batch %4lld, microbatch %2lld: largest stage %.1f GiB per GPU, %.1f samples/s\n",
                layout.name, layout.tensor_parallel, layout.pipeline_stages, layout.gpus,
                static_cast<long long>(layout.global_batch), static_cast<long long>(layout.microbatch),
                largest_stage_bytes(plan) / (1ull << 30), plan.predicted_samples_per_second());
    EXPECT_LE(largest_stage_bytes(plan), 80.0 * (1ull << 30))
        << layout.name << ": " << largest_stage_bytes(plan) / (1ull << 30) << " GiB";
  }
}

// Without recomputation the small models' layouts do not fit (the memory model is not lax): the
// check above is carried by per-layer checkpointing.
TEST(MegatronLayouts, SmallModelsNeedRecomputation) {
  for (const MegatronLayout& layout : kTableOne) {
    if (layout.pipeline_stages > 1) continue;
    const Graph model = gpt_of(layout);
    const Graph graph = layout.tensor_parallel > 1 ? tensor_parallel_graph(model, layout.tensor_parallel) : model;
    EXPECT_THROW(megatron_plan(layout, graph, "none"), Error) << layout.name;
  }
}

// The automatic plan (rannc, recompute = "auto", the layout's t) of the models of one or two stages
// is predicted at least as fast as Megatron's layout under its per-layer recomputation: the
// planner may keep activations where they fit, or recompute selectively, instead of repeating every
// forward. (The deep pipelines: validation/perf/README.md, `partrain plan` at scale.)
TEST(MegatronLayouts, AutomaticPlansAreAtLeastAsFastAsTheLayouts) {
  for (const MegatronLayout& layout : kTableOne) {
    if (layout.pipeline_stages > 2) continue;
    const Graph model = gpt_of(layout);
    const Graph graph = layout.tensor_parallel > 1 ? tensor_parallel_graph(model, layout.tensor_parallel) : model;
    const Plan megatron = megatron_plan(layout, graph, "layers");
    partition::PlannerOptions options;
    options.planner = "rannc";
    options.world_size = layout.gpus;
    options.tensor_parallel = layout.tensor_parallel;
    options.global_batch = layout.global_batch;
    options.mixed_precision = true;
    options.memory_margin = 0;
    options.max_microbatches = 64;
    const auto cost = partition::make_analytic_cost_model(graph, a100(), /*mixed_precision=*/true);
    const Plan automatic = partition::make_plan(graph, *cost, options);
    EXPECT_LE(largest_stage_bytes(automatic), 80.0 * (1ull << 30)) << layout.name;
    std::printf("%-6s Megatron's layout %.1f samples/s, rannc %.1f samples/s (%d stages, recompute %s on stage 0): %.3fx\n",
                layout.name, megatron.predicted_samples_per_second(), automatic.predicted_samples_per_second(),
                automatic.pipeline_stages(), recompute_name(automatic.stages[0].recompute),
                automatic.predicted_samples_per_second() / megatron.predicted_samples_per_second());
    EXPECT_GE(automatic.predicted_samples_per_second(), megatron.predicted_samples_per_second() * (1 - 1e-9))
        << layout.name << ": rannc " << automatic.predicted_samples_per_second() << " samples/s, Megatron's layout "
        << megatron.predicted_samples_per_second();
  }
}

}  // namespace
}  // namespace partrain
