// The analytic cost model's kernel timing (partition/common/kernel_timing.h; issue 25 item 3):
// GEMMs against hand-derived tile and wave counts (NVIDIA's "Matrix Multiplication Background"
// §3), the roofline for memory-bound shapes, streaming ops by their bytes, the backward GEMMs by
// their own shapes, the analytic model summing its tasks' kernels, the optimizer's memory sweep,
// and the data-parallel all-reduce hidden behind the last backward against an event simulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "app/planning.h"
#include "core/error.h"
#include "graph/graph.h"
#include "models/model.h"
#include "partition/common/cost_model.h"
#include "partition/common/kernel_timing.h"
#include "partition/planner.h"
#include "support/tiny_models.h"

namespace partrain {
namespace {

using partition::KernelModel;

// 10 multiprocessors of 5 TFLOP/s each (100 TFLOP/s peak at efficiency 0.5), 1 TB/s, no fixed cost.
KernelModel toy_chip() {
  KernelModel kernels;
  kernels.peak_flops = 100e12;
  kernels.gemm_efficiency = 0.5;
  kernels.memory_bandwidth = 1e12;
  kernels.memory_efficiency = 1.0;
  kernels.multiprocessors = 10;
  return kernels;
}

TEST(KernelTiming, GemmTimeCountsWavesOfTiles) {
  const KernelModel chip = toy_chip();
  const double per_sm = 100e12 * 0.5 / 10;
  // 2560 × 128 output: ten 256×128 tiles, one wave.
  const double one_wave = 2.0 * 256 * 128 * 1024 / per_sm;
  EXPECT_DOUBLE_EQ(partition::gemm_math_seconds(chip, 2560, 128, 1024, 1), one_wave);
  // One more row: 256×128 tiles need 11 (two waves, 2·one_wave); 128×128 tiles need 21 (three
  // waves of half as long), the fastest: 1.5 × one_wave for 0.04 % more work (wave quantization).
  EXPECT_DOUBLE_EQ(partition::gemm_math_seconds(chip, 2561, 128, 1024, 1), 1.5 * one_wave);
  // A batched GEMM: 3 × 10 tiles, three waves.
  EXPECT_DOUBLE_EQ(partition::gemm_math_seconds(chip, 2560, 128, 1024, 3), 3 * one_wave);
  // A tile half filled costs a whole tile (tile quantization): 2560 × 64 takes as long as × 128.
  EXPECT_DOUBLE_EQ(partition::gemm_math_seconds(chip, 2560, 64, 1024, 1), one_wave);
  // The roofline: 4096 × 4096 over k = 8 moves (2·4096·8 + 4096²) elements of 2 bytes at 1 TB/s,
  // longer than its math (16 waves of 1.67 µs... = 26 µs against 34 µs).
  const double bytes = (4096.0 * 8 + 8.0 * 4096 + 4096.0 * 4096) * 2;
  EXPECT_GT(bytes / 1e12, partition::gemm_math_seconds(chip, 4096, 4096, 8, 1));
  EXPECT_DOUBLE_EQ(partition::gemm_seconds(chip, 4096, 4096, 8, 1, 2), bytes / 1e12);
  EXPECT_DOUBLE_EQ(partition::gemm_seconds(chip, 0, 4096, 8, 1, 2), 0.0);
}

TEST(KernelTiming, LargeGemmsRunAtTheMeasuredEfficiencyOnTheA100Preset) {
  KernelModel a100;
  a100.peak_flops = 312e12;
  a100.gemm_efficiency = 267.9 / 312;
  a100.memory_bandwidth = 2.039e12;
  a100.memory_efficiency = 0.9;
  a100.multiprocessors = 108;
  // 8192³: 32 × 64 = 2048 tiles of 256×128 in ⌈2048 / 108⌉ = 19 waves.
  const double expected = 19 * 2.0 * 256 * 128 * 8192 / (267.9e12 / 108);
  EXPECT_NEAR(partition::gemm_seconds(a100, 8192, 8192, 8192, 1, 2), expected, 1e-12);
  const double achieved = 2.0 * 8192 * 8192 * 8192 / expected;
  EXPECT_NEAR(achieved / 267.9e12, 2048.0 / (19 * 108), 1e-12);  // 99.8 % of the measured rate
}

// x [B, 64, 128] → Gemm with w [256, 128] and a bias → LayerNorm → Attention over 4 heads.
struct SmallLayer {
  Graph graph;
  int gemm = -1, layer_norm = -1, attention = -1;
  SmallLayer() {
    const int x = graph.add_input("x", {kBatch, 64, 128});
    const int w = graph.add_parameter("w", {256, 128});
    const int bias = graph.add_parameter("b", {256});
    const int y = graph.add(OpType::Gemm, "gemm", {x, w, bias});
    const int gamma = graph.add_parameter("gamma", {256});
    const int beta = graph.add_parameter("beta", {256});
    const int normed = graph.add(OpType::LayerNorm, "norm", {y, gamma, beta});
    const int heads = graph.add(OpType::Reshape, "heads", {normed}, Attributes().set("shape", std::vector<std::int64_t>{0, 0, 4, 64}));
    const int q = graph.add(OpType::Permute, "q", {heads}, Attributes().set("perm", std::vector<std::int64_t>{0, 2, 1, 3}));
    const int out = graph.add(OpType::Attention, "attention", {q, q, q}, Attributes().set("causal", std::int64_t{1}));
    graph.mark_output(out);
    gemm = graph.value(y).producer;
    layer_norm = graph.value(normed).producer;
    attention = graph.value(out).producer;
  }
};

TEST(KernelTiming, TasksArePricedByTheirShapes) {
  const SmallLayer layer;
  const KernelModel chip = toy_chip();
  const std::int64_t batch = 3;
  // Gemm: forward [192, 128] × [128, 256]; backward dX [192, 256] × [256, 128], dW [256, 192] ×
  // [192, 128] accumulated into f32 (read and written), and the bias gradient's pass over dY.
  const auto [gemm_forward, gemm_backward] = partition::task_kernel_seconds(layer.graph, layer.gemm, batch, chip, 2.0);
  EXPECT_DOUBLE_EQ(gemm_forward, partition::gemm_seconds(chip, 192, 256, 128, 1, 2.0));
  EXPECT_DOUBLE_EQ(gemm_backward, partition::gemm_seconds(chip, 192, 128, 256, 1, 2.0) +
                                      partition::gemm_seconds(chip, 256, 128, 192, 1, 2.0, 2.0 * 4 * 256 * 128) +
                                      192.0 * 256 * 2 / 1e12);
  // LayerNorm streams its input and output (bf16 activations: 2 bytes), the gradients twice the input.
  const double activation = 3.0 * 64 * 256 * 2;
  const auto [norm_forward, norm_backward] = partition::task_kernel_seconds(layer.graph, layer.layer_norm, batch, chip, 2.0);
  EXPECT_DOUBLE_EQ(norm_forward, 2 * activation / 1e12);
  EXPECT_DOUBLE_EQ(norm_backward, 3 * activation / 1e12);
  // In fp32 plans the same op moves twice the bytes.
  EXPECT_DOUBLE_EQ(partition::task_kernel_seconds(layer.graph, layer.layer_norm, batch, chip, 4.0).first, 2 * norm_forward);
}

TEST(KernelTiming, FusedAttentionKeepsItsScoresOnChip) {
  const SmallLayer layer;
  const KernelModel chip = toy_chip();
  const auto fused = partition::task_kernel_seconds(layer.graph, layer.attention, 2, chip, 2.0);
  // q kᵀ and P v as 2 × 4 = 8 batched GEMMs of [64, 64] over 64, math only (the operands move
  // 4 × 8 × 64 × 64 × 2 bytes, less than the math here); the backward recomputes the scores.
  const double gemm = partition::gemm_math_seconds(chip, 64, 64, 64, 8);
  EXPECT_DOUBLE_EQ(fused.first, 2 * gemm);
  EXPECT_DOUBLE_EQ(fused.second, 5 * gemm);  // scores again, dV, dP, dQ, dK
}

// The unfused form (MatMul, Softmax, Dropout, MatMul) moves its B·h·S·T scores through
// memory in every op: at sequence 2048 it is slower than the fused op.
TEST(KernelTiming, UnfusedAttentionPaysForItsScoresInMemory) {
  ModelConfig config = testing::tiny_model_config("gpt");
  config.seq_len = config.max_position = 2048;
  config.hidden = 1024;
  config.heads = 16;
  const auto seconds = [&](bool fused) {
    config.fused_attention = fused;
    config.attention_dropout = fused ? 0.0 : 0.1;
    const Graph model = build_model(config);
    partition::DeviceSpec device;
    device.kernels = toy_chip();
    std::vector<int> all(model.tasks().size());
    std::iota(all.begin(), all.end(), 0);
    const profile::Measurement m = partition::make_analytic_cost_model(model, device, true)->measure(all, 2);
    return m.forward_seconds + m.backward_seconds;
  };
  const double unfused = seconds(false), fused = seconds(true);
  // Per layer the unfused form streams 2 × 16 × 2048² scores of 2 bytes through Softmax and Dropout
  // (forward 4 bytes each, backward 6): 2 layers × 20 × 134 Mi score-bytes at 1 TB/s, less the
  // score GEMMs the fused op's backward repeats (the unfused one keeps the probabilities).
  EXPECT_GT(unfused - fused, 2 * 20 * 2.0 * 16 * 2048 * 2048 / 1e12 * 0.8);
}

TEST(KernelTiming, TheAnalyticModelSumsItsTasksKernels) {
  const Graph model = build_model(testing::tiny_model_config("gpt"));
  partition::DeviceSpec device;
  device.kernels = toy_chip();
  device.kernels.kernel_seconds = 2e-6;
  const auto cost = partition::make_analytic_cost_model(model, device, /*mixed_precision=*/true);
  std::vector<int> all(model.tasks().size());
  std::iota(all.begin(), all.end(), 0);
  for (std::int64_t batch : {1, 5}) {
    double forward = 0, backward = 0;
    for (int task : all) {
      const auto [f, b] = partition::task_kernel_seconds(model, task, model.task(task).constant ? 1 : batch,
                                                         device.kernels, 2.0);
      forward += f;
      backward += b;
    }
    const profile::Measurement m = cost->measure(all, batch);
    EXPECT_NEAR(m.forward_seconds, forward, 1e-15) << "batch " << batch;
    EXPECT_NEAR(m.backward_seconds, backward, 1e-15) << "batch " << batch;
    EXPECT_GT(m.backward_seconds, m.forward_seconds);
  }
  // AdamW's step: 7 passes over the f32 parameters and half a pass for their bf16 copy.
  EXPECT_DOUBLE_EQ(cost->optimizer_step_seconds(4e9, "adamw"), 7.5 * 4e9 / 1e12 + 2e-6);
  EXPECT_NE(cost->description().find("analytic kernels"), std::string::npos) << cost->description();
}

// A bucketed all-reduce: buckets ready at k·B/n during the last backward, all-reduced one after
// another, A/n each; what finishes after the backward, by simulation.
double exposed_by_simulation(double allreduce, double backward, int buckets) {
  double clock = 0;
  for (int k = 1; k <= buckets; ++k) clock = std::max(clock, k * backward / buckets) + allreduce / buckets;
  return clock - backward;
}

TEST(KernelTiming, HiddenAllReduceMatchesABucketSimulation) {
  for (double allreduce : {0.3, 1.0, 2.0, 5.0})
    for (double backward : {0.5, 2.0})
      for (int buckets : {1, 2, 7, 40}) {
        const double hidden = partition::allreduce_hidden_seconds(allreduce, backward, buckets * 25.0, 25.0);
        EXPECT_NEAR(allreduce - hidden, exposed_by_simulation(allreduce, backward, buckets), 1e-12)
            << "A " << allreduce << ", B " << backward << ", " << buckets << " buckets";
      }
  EXPECT_EQ(partition::allreduce_hidden_seconds(1.0, 2.0, 100.0, 0.0), 0.0);  // no overlap asked
}

// bf16 data parallelism on 4 replicas of one stage (uniform planner, 2 microbatches of 8): the
// data-parallel gradient synchronisation is the stage's only communication.
partition::PlannerOptions one_stage_on_four_replicas() {
  partition::PlannerOptions options;
  options.planner = "uniform";
  options.world_size = 4;
  options.stages = 1;
  options.global_batch = 16;
  options.microbatches = 2;
  options.mixed_precision = true;
  return options;
}

TEST(KernelTiming, PlansPriceTheOverlapOfTheDataParallelAllReduce) {
  const Graph model = build_model(testing::tiny_model_config("gpt"));
  partition::DeviceSpec device;
  device.kernels = toy_chip();
  device.network_bandwidth = device.link_bandwidth = 1e9;  // slow enough for the all-reduce to matter
  const auto cost = partition::make_analytic_cost_model(model, device, true);
  partition::PlannerOptions options = one_stage_on_four_replicas();
  const Plan blocking = partition::make_plan(model, *cost, options);
  options.overlap_bucket_bytes = 64 * 1024;
  const Plan overlapped = partition::make_plan(model, *cost, options);
  const PlanStage& stage = overlapped.stages[0];
  EXPECT_EQ(blocking.stages[0].allreduce_hidden_seconds, 0.0);
  ASSERT_GT(stage.allreduce_hidden_seconds, 0.0);
  EXPECT_DOUBLE_EQ(stage.allreduce_seconds, blocking.stages[0].allreduce_seconds);
  EXPECT_NEAR(overlapped.predicted_step_seconds, blocking.predicted_step_seconds - stage.allreduce_hidden_seconds, 1e-12);
}

// ZeRO-1 as the runtime runs it: a bucketed reduce-scatter of the fp32 gradients (half an
// all-reduce, hidden as far as the backward allows) and an all-gather after the step in the working
// precision (bf16: half the bytes) that hides under nothing.
TEST(KernelTiming, ZeroPricesItsReduceScatterAndItsBf16AllGatherApart) {
  const Graph model = build_model(testing::tiny_model_config("gpt"));
  partition::DeviceSpec device;
  device.kernels = toy_chip();
  device.network_bandwidth = device.link_bandwidth = 1e9;
  const auto cost = partition::make_analytic_cost_model(model, device, true);
  const double bytes = 64e6;
  const double all_reduce = cost->allreduce_seconds(bytes, 4, false);
  const auto plain = partition::gradient_synchronisation_seconds(*cost, bytes, 4, false, false, true);
  EXPECT_DOUBLE_EQ(plain.reduce, all_reduce);
  EXPECT_EQ(plain.gather, 0.0);
  const auto fp32 = partition::gradient_synchronisation_seconds(*cost, bytes, 4, false, true, false);
  EXPECT_DOUBLE_EQ(fp32.reduce, all_reduce / 2);
  EXPECT_DOUBLE_EQ(fp32.gather, all_reduce / 2);
  const auto bf16 = partition::gradient_synchronisation_seconds(*cost, bytes, 4, false, true, true);
  EXPECT_DOUBLE_EQ(bf16.reduce, all_reduce / 2);
  EXPECT_DOUBLE_EQ(bf16.gather, cost->allreduce_seconds(bytes / 2, 4, false) / 2);
  EXPECT_LT(bf16.total(), 0.8 * all_reduce);

  partition::PlannerOptions options = one_stage_on_four_replicas();
  options.overlap_bucket_bytes = 64 * 1024;
  const Plan replicated = partition::make_plan(model, *cost, options);
  options.zero = 1;
  const Plan sharded = partition::make_plan(model, *cost, options);
  const PlanStage& whole = replicated.stages[0];
  const PlanStage& stage = sharded.stages[0];
  const double parameter_bytes = cost->measure(stage.tasks, 2).parameter_bytes;
  ASSERT_GT(parameter_bytes, 0.0);
  EXPECT_DOUBLE_EQ(whole.allreduce_seconds, cost->allreduce_seconds(parameter_bytes, 4, false));
  // The same gradients: the reduce-scatter is half the all-reduce, and only it hides under the backward.
  const double reduce_scatter = whole.allreduce_seconds / 2;
  const double gather = cost->allreduce_seconds(parameter_bytes / 2, 4, false) / 2;
  EXPECT_DOUBLE_EQ(stage.allreduce_seconds, reduce_scatter + gather);
  EXPECT_DOUBLE_EQ(stage.allreduce_hidden_seconds,
                   partition::allreduce_hidden_seconds(reduce_scatter, stage.backward_seconds, parameter_bytes,
                                                       options.overlap_bucket_bytes));
  EXPECT_GT(stage.allreduce_hidden_seconds, 0.0);
  EXPECT_GE(stage.allreduce_seconds - stage.allreduce_hidden_seconds, gather) << "the all-gather is exposed";
}

// [parallel] device_model in an experiment file: the preset's kernels for the plan's precision, the
// 3D search by default (tensor_parallel and zero that the file leaves unset), the all-reduce overlap;
// without a GPU model the defaults stay 1 and 0 and the plan output says why.
TEST(KernelTiming, ExperimentFilesWithAGpuModelPlanInThreeDimensions) {
  const auto setup = [](const std::string& text) {
    const ConfigDocument document =
        ConfigDocument::parse("[model]\ntype = \"gpt\"\n[train]\nprecision = \"bf16\"\n[parallel]\n" + text, "x.toml");
    ExperimentConfig config;
    config.model = read_model_config(document);
    config.train = read_train_config(document);
    config.parallel = read_parallel_config(document);
    return app::planning_setup(config, 64);
  };
  const app::PlanningSetup gpu = setup("device_model = \"h100-sxm\"\n");
  EXPECT_TRUE(gpu.device.kernels.enabled());
  EXPECT_DOUBLE_EQ(gpu.device.kernels.peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(gpu.device.kernels.gemm_efficiency, 792.1 / 989);
  EXPECT_EQ(gpu.device.kernels.multiprocessors, 132);
  EXPECT_EQ(gpu.options.tensor_parallel, 0);
  EXPECT_EQ(gpu.options.zero, -1);
  EXPECT_DOUBLE_EQ(gpu.options.overlap_bucket_bytes, 25.0 * (1 << 20));
  EXPECT_NE(gpu.layout_note.find("tensor_parallel and zero not set: searched"), std::string::npos) << gpu.layout_note;
  const app::PlanningSetup fixed = setup("device_model = \"h100-sxm\"\ntensor_parallel = 2\n");
  EXPECT_EQ(fixed.options.tensor_parallel, 2);
  EXPECT_EQ(fixed.options.zero, -1);
  const app::PlanningSetup cpu = setup("");
  EXPECT_FALSE(cpu.device.kernels.enabled());
  EXPECT_EQ(cpu.options.tensor_parallel, 1);
  EXPECT_EQ(cpu.options.zero, 0);
  EXPECT_EQ(cpu.options.overlap_bucket_bytes, 0.0);
  EXPECT_NE(cpu.layout_note.find("kept at 1 and 0"), std::string::npos) << cpu.layout_note;
  EXPECT_EQ(setup("tensor_parallel = 1\nzero = 0\n").layout_note, "");
}

}  // namespace
}  // namespace partrain
