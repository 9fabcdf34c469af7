// Activation memory as the backward needs it (issue 14 item 3): the saved tensors of the op schemas
// (graph/saved_tensors.h) against Korthikanti et al. 2022, "Reducing Activation Recomputation in
// Large Transformer Models", §4, per model size; and the runtime's freeing of everything else
// leaves the gradients bit-identical (every backward kernel reads only what its op declares).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "graph/activation_checkpointing.h"
#include "graph/autodiff.h"
#include "graph/interpreter.h"
#include "graph/layer_names.h"
#include "graph/saved_tensors.h"
#include "graph/tensor_parallel.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"
#include "partition/common/cost_model.h"
#include "graph/tensor_parallel.h"
#include "partition/common/recomputation.h"
#include "partition/planner.h"
#include "runtime/stage_program.h"
#include "support/gradient_check.h"
#include "support/tiny_models.h"

namespace partrain {
namespace {

struct TransformerCase {
  const char* name;
  const char* type;  // "gpt" or "bert"
  std::int64_t hidden, heads, intermediate, seq_len, batch;
  double dropout;
  bool fused_attention;
};

ModelConfig transformer_config(const TransformerCase& c) {
  ModelConfig config;
  config.type = c.type;
  config.layers = 4;  // layers 1 and 2 are measured; the vocabulary does not enter a layer
  config.hidden = c.hidden;
  config.heads = c.heads;
  config.intermediate = c.intermediate;
  config.vocab = 1024;
  config.max_position = c.seq_len;
  config.seq_len = c.seq_len;
  config.dropout = c.dropout;
  config.fused_attention = c.fused_attention;
  return config;
}

std::vector<int> tasks_of_layers(const Graph& graph, const std::vector<std::string>& layers) {
  std::vector<int> tasks;
  for (const Task& task : graph.tasks())
    for (const std::string& layer : layers)
      if (layer_of(task.name) == layer) tasks.push_back(task.id);
  return tasks;
}

// One transformer layer's activation bytes by the analytic cost model: A(layers 1, 2) − A(layer 1)
// at the case's batch. The boundary terms (layer 1's input, the set's last output) cancel, leaving
// layer 2's saved tensors and its output (which layer 3 reads and saves: one residual stream per
// layer, the "layer norm input" of Korthikanti's count).
// On one rank of a tensor-parallel group of t (with or without sequence parallelism) when t > 1.
double analytic_bytes_per_layer(const TransformerCase& c, bool bf16, int t = 1, bool sequence_parallel = false) {
  const Graph graph = tensor_parallel_graph(build_model(transformer_config(c)), t, sequence_parallel);
  const std::string prefix = std::string(c.type) == "gpt" ? "h." : "encoder.layer.";
  const auto model = partition::make_analytic_cost_model(graph, partition::DeviceSpec{}, bf16);
  const std::vector<int> one = tasks_of_layers(graph, {prefix + "1"});
  const std::vector<int> two = tasks_of_layers(graph, {prefix + "1", prefix + "2"});
  EXPECT_FALSE(one.empty()) << c.name << ": no tasks in layer " << prefix << "1";
  return model->measure(two, c.batch).activation_bytes - model->measure(one, c.batch).activation_bytes;
}

// Korthikanti et al. §4 adapted to our ops, computed from the formula alone (bytes per layer).
// Their count, 16-bit activations, no recomputation, no sequence/tensor parallelism:
//   s·b·h·34 + 5·a·s²·b:  attention 11sbh + 5as²b (QKV input 2sbh, Q and K 4sbh, softmax output
//   2as²b, its dropout mask as²b, dropout output 2as²b, V 2sbh, projection input 2sbh, output
//   dropout mask sbh), MLP 19sbh (input 2sbh, GELU input 8sbh, GELU output 8sbh, dropout mask sbh),
//   two layer-norm inputs 4sbh.
// Our deviations, term by term:
//   (1) no dropout masks: our Dropout regenerates its mask in the backward from the Philox counter
//       (kernels/*/elementwise: dropout_backward), so it saves nothing: −as²b − 2sbh (1-byte masks).
//   (2) MLP width: GELU input and output are s·b·i elements each (Megatron's 8sbh assume i = 4h):
//       +2·2·s·b·(i − 4h) bytes in 16-bit.
//   (3) attention dropout p = 0: no Dropout task, the context MatMul reads the softmax output
//       itself: −2as²b (the dropout output).
//   (4) fused Attention: the probabilities are recomputed in the backward, nothing of a·s² is saved:
//       −2as²b (softmax output) −2as²b (dropout output).
//   (5) element size: every remaining term counts 2-byte elements; fp32 plans keep fp32 activations
//       (×2), bf16 plans bf16 (×1).
//   Layer-norm statistics: Megatron does not count them and neither do we (our LayerNorm backward
//   recomputes mean and 1/std from its input). The same count holds for BERT's post-LN layer: QKV
//   input (the previous layer's output), Q, K, V, context, attention-output LN input, MLP input,
//   GELU input and output, output LN input.
double korthikanti_bytes_per_layer(const TransformerCase& c, bool bf16) {
  const double s = static_cast<double>(c.seq_len), b = static_cast<double>(c.batch);
  const double h = static_cast<double>(c.hidden), a = static_cast<double>(c.heads);
  const double i = static_cast<double>(c.intermediate > 0 ? c.intermediate : 4 * c.hidden);
  const double published = s * b * h * 34 + 5 * a * s * s * b;      // 16-bit, their §4
  double ours = published - (a * s * s * b + 2 * s * b * h);          // (1)
  ours += 2 * 2 * s * b * (i - 4 * h);                               // (2)
  if (!c.fused_attention && c.dropout == 0) ours -= 2 * a * s * s * b;  // (3)
  if (c.fused_attention) ours -= 4 * a * s * s * b;                  // (4)
  return ours * (bf16 ? 1.0 : 2.0);                                  // (5)
}

const TransformerCase kCases[] = {
    // name, type, hidden, heads, intermediate, seq, batch, dropout, fused
    {"gpt-tiny", "gpt", 128, 4, 0, 64, 2, 0.1, false},
    {"gpt2-small", "gpt", 768, 12, 0, 1024, 1, 0.1, false},
    {"gpt3-175b-layer", "gpt", 12288, 96, 0, 2048, 1, 0.1, false},
    {"gpt2-small-fused", "gpt", 768, 12, 0, 1024, 2, 0.1, true},
    {"gpt-tiny-no-dropout", "gpt", 128, 4, 0, 64, 3, 0.0, false},
    {"bert-tiny", "bert", 128, 2, 512, 64, 2, 0.1, false},
    {"bert-base", "bert", 768, 12, 0, 512, 2, 0.1, false},
    {"bert-large", "bert", 1024, 16, 0, 512, 1, 0.1, false},
    {"bert-large-fused", "bert", 1024, 16, 0, 512, 1, 0.1, true},
};

// Korthikanti et al. Table 2, the rows with t-way tensor parallelism, per rank and layer (16-bit):
//   "tensor parallelism (baseline)": s·b·h·(10 + 24/t + 5as/(ht)): replicated LayerNorm inputs 4sbh,
//     QKV and MLP inputs 2sbh each, the two dropout masks after the row-parallel layers 2sbh; split
//     Q, K, V, projection input, GELU input and output 24sbh/t; attention 5as²b/t.
//   "tensor + sequence parallelism": s·b·h/t·(34 + 5as/h): everything of §4's count split over t.
// Ours, term by term against each row (the deviations (1)–(5) above, taken per rank):
//   (1) no dropout masks: tensor parallel −2sbh (the replicated ones) − as²b/t; sequence parallel
//       −(2sbh + as²b)/t.
//   (2) MLP width: +2·2·s·b·(i − 4h)/t (the GELU input and output are split over t in both rows).
//   (3), (4) as above, divided by t (the attention tensors hold the rank's heads).
//   (5) element size as above.
//   (6) sequence parallelism only: the inputs of the two column-parallel GEMMs (QKV, MLP-up) are
//       the all-gathered [b, s, h] tensors, which the GEMMs save whole for their weight gradients;
//       Megatron saves the rank's part and all-gathers it again in the backward (§4.2.2), so the
//       row counts 2sbh/t for each: +2·2sbh·(1 − 1/t).
double korthikanti_parallel_bytes_per_layer(const TransformerCase& c, bool bf16, int t, bool sequence_parallel) {
  const double s = static_cast<double>(c.seq_len), b = static_cast<double>(c.batch);
  const double h = static_cast<double>(c.hidden), a = static_cast<double>(c.heads);
  const double i = static_cast<double>(c.intermediate > 0 ? c.intermediate : 4 * c.hidden);
  const double published = sequence_parallel ? s * b * h / t * (34 + 5 * a * s / h)        // Table 2, 16-bit
                                             : s * b * h * (10 + 24.0 / t + 5 * a * s / (h * t));
  double ours = published - (sequence_parallel ? (2 * s * b * h + a * s * s * b) / t       // (1)
                                               : 2 * s * b * h + a * s * s * b / t);
  ours += 2 * 2 * s * b * (i - 4 * h) / t;                                                 // (2)
  if (!c.fused_attention && c.dropout == 0) ours -= 2 * a * s * s * b / t;                 // (3)
  if (c.fused_attention) ours -= 4 * a * s * s * b / t;                                    // (4)
  if (sequence_parallel) ours += 2 * 2 * s * b * h * (1 - 1.0 / t);                        // (6)
  return ours * (bf16 ? 1.0 : 2.0);                                                        // (5)
}

TEST(ActivationMemory, PerLayerBytesPerRankMatchKorthikantiTensorAndSequenceParallelRows) {
  int checked = 0;
  for (const TransformerCase& c : kCases) {
    for (int t : {2, 4}) {
      const std::int64_t intermediate = c.intermediate > 0 ? c.intermediate : 4 * c.hidden;
      if (c.heads % t != 0 || c.seq_len % t != 0 || intermediate % t != 0) continue;
      for (bool sequence_parallel : {false, true}) {
        for (bool bf16 : {false, true}) {
          // Exact up to the rounding of the /t terms (sums of integers and halves, quarters).
          const double expected = korthikanti_parallel_bytes_per_layer(c, bf16, t, sequence_parallel);
          EXPECT_NEAR(analytic_bytes_per_layer(c, bf16, t, sequence_parallel), expected, 1e-9 * expected)
              << c.name << " t=" << t << (sequence_parallel ? " sequence parallel" : " tensor parallel")
              << (bf16 ? " bf16" : " fp32");
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 50);
  // The published rows themselves for GPT-3's layer (s 2048, h 12288, a 96, b 1, t 8), 16-bit, and
  // sequence parallelism dividing the no-parallelism figure by t exactly.
  const double s = 2048, h = 12288, a = 96, t = 8;
  EXPECT_EQ(s * h / t * (34 + 5 * a * s / h), (855638016.0 + 2013265920.0) / 8);
  EXPECT_EQ(s * h * (10 + 24 / t + 5 * a * s / (h * t)), s * h * 13 + 5 * a * s * s / t);
}

TEST(ActivationMemory, PerLayerBytesMatchKorthikantiAdaptedToOurOps) {
  for (const TransformerCase& c : kCases) {
    for (bool bf16 : {false, true}) {
      // Exact: both sides are sums of integers far below 2^53.
      EXPECT_EQ(analytic_bytes_per_layer(c, bf16), korthikanti_bytes_per_layer(c, bf16))
          << c.name << (bf16 ? " bf16" : " fp32");
    }
  }
}

// The published figure itself for GPT-3's layer (s 2048, h 12288, a 96, b 1), 16-bit, as a check of
// the formula's transcription: 34·sbh + 5·as²b = 855,638,016 + 2,013,265,920 bytes (2.67 GiB).
TEST(ActivationMemory, PublishedGpt3LayerFigure) {
  const TransformerCase c = kCases[2];
  const double published = 2048.0 * 12288 * 34 + 5.0 * 96 * 2048 * 2048;
  EXPECT_EQ(published, 855638016.0 + 2013265920.0);
  // Ours in bf16: 32 sbh + 4 as²b (no masks).
  EXPECT_EQ(analytic_bytes_per_layer(c, true), 2048.0 * 12288 * 32 + 4.0 * 96 * 2048 * 2048);
}

// ---------------------------------------------------------------------------------------------
// Korthikanti et al. 2022, Table 2: activation bytes per transformer layer under each recompute
// policy and tensor parallelism, adapted to our ops term by term as above, against the planner's
// figures (partition/common/recomputation.h) for layers 1–2 minus layer 1.
// ---------------------------------------------------------------------------------------------

// The planner's per-microbatch kept bytes (and the largest recomputed segment) of `tasks` under
// `policy`.
partition::StageRecomputation recomputation_of(const Graph& graph, const std::vector<int>& tasks, RecomputePolicy policy,
                                               std::int64_t batch, bool bf16) {
  PlanStage stage;
  stage.tasks = tasks;
  stage.recompute = policy;
  const auto cost = partition::make_analytic_cost_model(graph, partition::DeviceSpec{}, bf16);
  return partition::stage_recomputation(graph, *cost, stage, batch, bf16, cost->measure(tasks, batch));
}

// Kept bytes of one layer under `policy` (None: the saved tensors) on the tensor-parallel graph of
// degree t (1: the model), with or without sequence parallelism.
double kept_bytes_per_layer(const TransformerCase& c, RecomputePolicy policy, int t, bool bf16,
                            bool sequence_parallel = false) {
  const Graph model = build_model(transformer_config(c));
  const Graph graph = t > 1 ? tensor_parallel_graph(model, t, sequence_parallel) : model;
  const std::string prefix = std::string(c.type) == "gpt" ? "h." : "encoder.layer.";
  const std::vector<int> one = tasks_of_layers(graph, {prefix + "1"});
  const std::vector<int> two = tasks_of_layers(graph, {prefix + "1", prefix + "2"});
  if (policy == RecomputePolicy::None) {  // everything saved: the cost model's activation bytes
    const auto cost = partition::make_analytic_cost_model(graph, partition::DeviceSpec{}, bf16);
    return cost->measure(two, c.batch).activation_bytes - cost->measure(one, c.batch).activation_bytes;
  }
  return recomputation_of(graph, two, policy, c.batch, bf16).checkpoint_bytes -
         recomputation_of(graph, one, policy, c.batch, bf16).checkpoint_bytes;
}

// Table 2, per layer, 16-bit, our deviations applied (see korthikanti_bytes_per_layer):
//   no recomputation, t-way tensor parallelism: sbh(10 + 24/t) + 5as²b/t. The replicated 10sbh are
//     the two layer-norm inputs 4sbh, the QKV and MLP inputs 4sbh and the two hidden dropout masks
//     2sbh; the split 24sbh/t are Q, K, V 6sbh, the projection input 2sbh, GELU input and output
//     16sbh; the attention core 5as²b/t. Ours: (1) no masks −2sbh − as²b/t; (2) MLP width
//     +4sb(i − 4h)/t; (3) attention dropout p = 0: −2as²b/t; (4) fused attention: −4as²b/t.
//   selective recomputation: the attention core goes, sbh(10 + 24/t); ours −2sbh (masks) +(2).
//     Fused attention already recomputes its probabilities: the same figure.
//   full recomputation (per-layer checkpoints): 2sbh — the layer's input, whatever t (it is
//     replicated over the tensor-parallel group).
//   With sequence parallelism (the rank holds 1/t of the sequence outside the tensor-parallel
//   regions): selective 34sbh/t, ours −2sbh/t (masks) +(2) + (6) 4sbh(1 − 1/t) (the column-parallel
//   GEMMs save their all-gathered inputs whole, see korthikanti_parallel_bytes_per_layer); full
//   recomputation 2sbh/t, the rank's part of the layer's input.
double table2_bytes_per_layer(const TransformerCase& c, RecomputePolicy policy, int t, bool bf16,
                              bool sequence_parallel = false) {
  const double s = static_cast<double>(c.seq_len), b = static_cast<double>(c.batch);
  const double h = static_cast<double>(c.hidden), a = static_cast<double>(c.heads);
  const double i = static_cast<double>(c.intermediate > 0 ? c.intermediate : 4 * c.hidden);
  double ours = 0;
  if (policy == RecomputePolicy::Layers) {
    ours = 2 * s * b * h / (sequence_parallel ? t : 1);
  } else if (sequence_parallel) {
    ours = s * b * h / t * 34 - 2 * s * b * h / t + 4 * s * b * (i - 4 * h) / t + 4 * s * b * h * (1 - 1.0 / t);
  } else {
    const double published = s * b * h * (10 + 24.0 / t) + (policy == RecomputePolicy::None ? 5 * a * s * s * b / t : 0.0);
    ours = published - 2 * s * b * h + 4 * s * b * (i - 4 * h) / t;        // (1) hidden masks, (2)
    if (policy == RecomputePolicy::None) {
      ours -= a * s * s * b / t;                                             // (1) attention mask
      if (!c.fused_attention && c.dropout == 0) ours -= 2 * a * s * s * b / t;  // (3)
      if (c.fused_attention) ours -= 4 * a * s * s * b / t;                  // (4)
    }
  }
  return ours * (bf16 ? 1.0 : 2.0);
}

TEST(ActivationMemory, RecomputePoliciesMatchKorthikantiTable2) {
  for (const TransformerCase& c : kCases) {
    if (c.seq_len * c.hidden > 1024 * 1024) continue;  // the GPT-3 layer: the row above covers it
    for (bool bf16 : {false, true}) {
      for (RecomputePolicy policy : {RecomputePolicy::Selective, RecomputePolicy::Layers})
        EXPECT_EQ(kept_bytes_per_layer(c, policy, 1, bf16), table2_bytes_per_layer(c, policy, 1, bf16))
            << c.name << " " << recompute_name(policy) << (bf16 ? " bf16" : " fp32");
    }
  }
}

// The recompute rows with t-way tensor parallelism, without and with sequence parallelism (the rows
// without recomputation: PerLayerBytesPerRankMatchKorthikantiTensorAndSequenceParallelRows).
TEST(ActivationMemory, TensorAndSequenceParallelRecomputeRowsOfKorthikantiTable2) {
  int checked = 0;
  for (const TransformerCase& c : kCases) {
    if (c.seq_len * c.hidden > 1024 * 1024) continue;
    for (int t : {2, 4}) {
      const std::int64_t intermediate = c.intermediate > 0 ? c.intermediate : 4 * c.hidden;
      if (c.heads % t != 0 || c.seq_len % t != 0 || intermediate % t != 0) continue;
      for (bool sequence_parallel : {false, true})
        for (RecomputePolicy policy : {RecomputePolicy::Selective, RecomputePolicy::Layers}) {
          const double expected = table2_bytes_per_layer(c, policy, t, true, sequence_parallel);
          EXPECT_NEAR(kept_bytes_per_layer(c, policy, t, true, sequence_parallel), expected, 1e-9 * expected)
              << c.name << " t = " << t << (sequence_parallel ? " sequence parallel " : " ") << recompute_name(policy);
          ++checked;
        }
    }
  }
  EXPECT_GE(checked, 20);
}

// Per-layer checkpointing holds one layer's saved tensors at a time during the backward: the
// largest recomputed segment of layers 1–2 is one layer's figure without its checkpointed input.
TEST(ActivationMemory, PerLayerCheckpointingRecomputesOneLayerAtATime) {
  for (const TransformerCase& c : kCases) {
    if (c.seq_len * c.hidden > 1024 * 1024) continue;
    const Graph graph = build_model(transformer_config(c));
    const std::string prefix = std::string(c.type) == "gpt" ? "h." : "encoder.layer.";
    const std::vector<int> two = tasks_of_layers(graph, {prefix + "1", prefix + "2"});
    const double layer_input = 4.0 * c.seq_len * c.batch * c.hidden;  // fp32
    EXPECT_EQ(recomputation_of(graph, two, RecomputePolicy::Layers, c.batch, false).recomputed_peak_bytes,
              korthikanti_bytes_per_layer(c, false) - layer_input)
        << c.name;
  }
}

// GPT-3 175B (configs/gpt3-175b.toml: 96 layers, h 12288, a 96, s 2048, vocabulary 51,200, bf16,
// AdamW) on 64 devices, uniform planner, t = 1, no ZeRO: what `partrain plan configs/gpt3-175b.toml
// --planner uniform --world-size 64 --set parallel.tensor_parallel=1 --set parallel.zero=0 --set
// parallel.stages=64` prints. 96 layers on 64 stages: stages 0–31 hold 2 layers (stage 0 also the
// embeddings), 32–63 one (63 also ln_f and the head). The planner picks 256 microbatches of 6
// samples, 1F1B with recomputation at the stage boundaries (S > 1). The largest stage is stage 1
// (h.2–3), derived by hand:
//   model state: 2 layers × (12h² + 13h) parameters × 18 bytes (fp32 weights 4 + gradients 4 + Adam
//     8, bf16 working copy 2; the bf16 gradients are working memory, one
//     parameter at a time)                                                     = 65,235,566,592
//   inputs kept for recomputation: 1F1B keeps S − 1 = 63 microbatches in flight on stage 1, each its
//     received [6, 2048, 12288] bf16 input (2·s·b·h)                          = 19,025,362,944
//   one microbatch's saved tensors while recomputing: 2 layers × (32sbh + 4as²b) (ours in bf16,
//     the Korthikanti figure less the masks; the stage's input counts as the first LayerNorm's
//     input, its output is saved by the next stage)                           = 28,991,029,248
//   working memory: the largest single output, the [6, 96, 2048, 2048] bf16 attention scores
//                                                                              =  4,831,838,208
// Total 118,083,796,992 bytes = 109.97 GiB (the `needs at least` of the 80 GiB request is this / 0.9:
// 122.19 GiB).
TEST(ActivationMemory, Gpt3UniformSixtyFourStagesMatchesHandDerivation) {
  ModelConfig config;
  config.type = "gpt";
  config.layers = 96;
  config.hidden = 12288;
  config.heads = 96;
  config.vocab = 51200;
  config.max_position = 2048;
  config.seq_len = 2048;
  config.dropout = 0.1;
  const Graph graph = build_model(config);
  partition::DeviceSpec device;
  device.flops_per_second = 156e12;
  device.memory_bytes = 1e15;  // room for any plan: the figure, not feasibility, is under test
  const auto cost = partition::make_analytic_cost_model(graph, device, /*mixed_precision=*/true);
  partition::PlannerOptions options;
  options.planner = "uniform";
  options.world_size = 64;
  options.stages = 64;
  options.global_batch = 1536;
  options.mixed_precision = true;
  options.max_microbatches = 256;
  options.recompute = "boundaries";  // what the figure derives (auto would keep everything: it fits)
  const Plan plan = partition::make_plan(graph, *cost, options);
  ASSERT_EQ(plan.stages.size(), 64u);
  ASSERT_EQ(plan.microbatches, 256);
  ASSERT_EQ(plan.microbatch_size(), 6);

  const double s = 2048, h = 12288, a = 96, b = 6;
  const double model_state = 2 * (12 * h * h + 13 * h) * 18;
  const double inputs_in_flight = 63 * (2 * s * b * h);
  const double saved_one_microbatch = 2 * (32 * s * b * h + 4 * a * s * s * b);
  const double largest_output = 2 * a * s * s * b;
  const double expected = model_state + inputs_in_flight + saved_one_microbatch + largest_output;
  EXPECT_EQ(expected, 118083796992.0);  // the sum in the comment above
  EXPECT_NEAR(plan.stages[1].memory_bytes, expected, 1.0);
  for (const PlanStage& stage : plan.stages) EXPECT_LE(stage.memory_bytes, plan.stages[1].memory_bytes + 1.0);
}

// ---------------------------------------------------------------------------------------------
// The runtime frees what no backward reads: gradients stay bit-identical, and the kernels read
// nothing they did not declare (a shape-only stand-in throws on data()).
// ---------------------------------------------------------------------------------------------


// The small models of the runtime tests: GPT and BERT (unfused attention, dropout 0.1; hidden 32,
// sequence 16) and a ResNet-18 of width 8 on 16x16 single-channel images.
ModelConfig small_transformer(const std::string& type, std::int64_t layers) {
  ModelConfig config;
  config.type = type;
  config.layers = layers;
  config.hidden = 32;
  config.heads = type == "bert" ? 2 : 4;
  if (type == "bert") config.intermediate = 64;
  config.vocab = 64;
  config.max_position = 16;
  config.seq_len = 16;
  config.dropout = 0.1;
  return config;
}

ModelConfig small_resnet() {
  ModelConfig resnet;
  resnet.type = "resnet";
  resnet.depth = 18;
  resnet.base_width = 8;
  resnet.classes = 4;
  resnet.image_size = 16;
  resnet.channels = 1;
  return resnet;
}

void expect_same_gradients_after_release(const ModelConfig& config, std::int64_t batch) {
  const Graph graph = build_model(config);
  const Subgraph all = whole_graph(graph);
  const BackwardProgram program = build_backward(graph, all);
  ExecutionOptions options;
  options.training = true;
  options.random = RandomContext{1234, 3, 1, 0, 0};
  const TensorMap feeds = testing::model_feeds(graph, batch);
  TensorMap values = feeds;
  run_forward(graph, all, values, cpu_backend(), options);

  const std::vector<int> saved = saved_for_backward(graph, program);
  TensorMap released = values;
  const std::size_t freed = release_unsaved(graph, released, {saved.begin(), saved.end()});
  EXPECT_GT(freed, 0u) << config.type;

  auto gradients = [&](const TensorMap& forward_values) {
    TensorMap grads;
    for (int v : program.output_grads) grads[v] = Tensor::full(forward_values.at(v).shape(), 1.0);
    run_backward(graph, program, forward_values, grads, cpu_backend(), options);
    return grads;
  };
  const TensorMap reference = gradients(values);
  const TensorMap after_release = gradients(released);

  // A forward that frees each value once its last reader has run (ExecutionOptions::keep) leaves
  // exactly the saved tensors (and the loss) and gives the same gradients.
  TensorMap freed_during = feeds;
  const std::unordered_set<int> keep(saved.begin(), saved.end());
  ExecutionOptions freeing = options;
  freeing.keep = &keep;
  run_forward(graph, all, freed_during, cpu_backend(), freeing);
  for (const auto& [id, tensor] : freed_during)
    if (is_microbatch_value(graph, id) && graph.value(id).kind == ValueKind::Activation)
      EXPECT_EQ(tensor.defined(), keep.count(id) == 1) << config.type << ": " << graph.value(id).name;
  const TensorMap after_freeing_during = gradients(freed_during);

  for (int p : program.parameter_grads) {
    const Tensor& x = reference.at(p);
    for (const TensorMap* other : {&after_release, &after_freeing_during}) {
      const Tensor& y = other->at(p);
      ASSERT_EQ(x.nbytes(), y.nbytes());
      EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0)
          << config.type << ": gradient of " << graph.value(p).name << " differs after freeing unsaved values";
    }
  }
}

TEST(ActivationMemory, FreeingUnsavedValuesKeepsGradientsBitIdentical) {
  for (const std::string type : {"gpt", "bert"}) {
    ModelConfig config = small_transformer(type, 2);
    expect_same_gradients_after_release(config, 2);
    config.fused_attention = true;
    expect_same_gradients_after_release(config, 2);
  }
  expect_same_gradients_after_release(small_resnet(), 2);
}

// A bf16 or fp16 op on a backend that computes it in fp32 (Backend::backward widens) gets the values
// its backward does not read as shape-only stand-ins (graph/interpreter.cpp); they must reach the
// kernel as fp32 stand-ins beside the widened copies, or a kernel that compares dtypes or dispatches
// on a stand-in's (Concat's layouts here; MaxPool2d, GlobalAvgPool, Tanh and Scale on CUDA in fp16)
// sees two types. The gradients must equal those of a backward given every value.
TEST(ActivationMemory, WidenedBackwardsTakeShapeOnlyStandIns) {
  using Ints = std::vector<std::int64_t>;
  struct Case {
    OpType type;
    Attributes attributes;
    std::vector<Tensor> inputs;
  };
  const std::vector<Case> cases = {
      {OpType::Concat, {{"axis", std::int64_t{1}}}, {testing::normal_tensor({2, 3}, 1), testing::normal_tensor({2, 5}, 2)}},
      {OpType::MaxPool2d, {{"kernel", Ints{2, 2}}}, {testing::normal_tensor({1, 2, 6, 6}, 3)}},
      {OpType::GlobalAvgPool, {}, {testing::normal_tensor({2, 3, 4, 4}, 4)}},
      {OpType::Tanh, {}, {testing::normal_tensor({4, 6}, 5)}},
      {OpType::Scale, {{"value", 0.5}}, {testing::normal_tensor({4, 6}, 6)}},
  };
  Backend& backend = cpu_backend();
  for (const DType dtype : {DType::BF16, DType::F16}) {
    for (const Case& c : cases) {
      const std::string name = std::string(op_name(c.type)) + " in " + dtype_name(dtype);
      std::vector<Tensor> inputs;
      for (const Tensor& input : c.inputs) inputs.push_back(to_dtype(input, dtype, backend));
      const std::vector<Tensor> outputs = testing::run_forward(c.type, c.attributes, inputs);
      std::vector<Tensor> output_grads;
      for (std::size_t k = 0; k < outputs.size(); ++k)
        output_grads.push_back(to_dtype(testing::normal_tensor(outputs[k].shape(), 10 + k), dtype, backend));
      const OpSchema& schema = op_schema(c.type);
      std::vector<Tensor> stand_in_inputs = inputs, stand_in_outputs = outputs;
      for (std::size_t i = 0; i < inputs.size(); ++i)
        if (!schema.input_is_saved(i)) stand_in_inputs[i] = inputs[i].shape_only();
      for (std::size_t k = 0; k < outputs.size(); ++k)
        if (!schema.output_is_saved(k)) stand_in_outputs[k] = outputs[k].shape_only();
      auto gradients = [&](const std::vector<Tensor>& given_inputs, const std::vector<Tensor>& given_outputs) {
        std::vector<Tensor> input_grads;
        for (const Tensor& input : inputs) input_grads.push_back(Tensor::empty(input.shape(), dtype));
        const KernelContext context{c.attributes, backend};
        backend.backward(c.type, context, given_inputs, given_outputs, output_grads, input_grads);
        return input_grads;
      };
      const std::vector<Tensor> expected = gradients(inputs, outputs);
      std::vector<Tensor> actual;
      try {
        actual = gradients(stand_in_inputs, stand_in_outputs);
      } catch (const Error& error) {
        ADD_FAILURE() << name << ": " << error.what();
        continue;
      }
      for (std::size_t i = 0; i < expected.size(); ++i)
        EXPECT_EQ(std::memcmp(actual[i].raw_data(), expected[i].raw_data(), expected[i].nbytes()), 0)
            << name << ": gradient of input " << i;
    }
  }
}

// Per-layer and selective recomputation through the runtime's stage program: the forward keeps only
// the checkpoints and the saved tensors outside the segments (exactly the bytes the planner
// predicts), the backward recomputes segment by segment, and the gradients are bit-identical to a
// backward over a full forward.
void expect_recomputation_keeps_gradients(const ModelConfig& config, RecomputePolicy policy, int layers,
                                          std::int64_t batch) {
  const Graph graph = build_model(config);
  Plan plan;
  plan.global_batch = batch;
  PlanStage stage;
  for (const Task& task : graph.tasks()) stage.tasks.push_back(task.id);
  stage.recompute = policy;
  stage.recompute_layers = layers;
  plan.stages.push_back(stage);
  const runtime::StageProgram program = runtime::build_stage_programs(graph, plan).at(0);
  const std::string name = config.type + " " + recompute_name(policy) + "/" + std::to_string(layers);
  ASSERT_FALSE(program.segments.empty()) << name << ": nothing is recomputed";

  ExecutionOptions options;
  options.training = true;
  options.random = RandomContext{1234, 3, 1, 0, 0};
  const TensorMap feeds = testing::model_feeds(graph, batch);
  const BackwardProgram& backward = program.backward;
  auto seeded = [&](const TensorMap& values) {
    TensorMap grads;
    for (int v : backward.output_grads) grads[v] = Tensor::full(values.at(v).shape(), 1.0);
    return grads;
  };
  TensorMap full = feeds;
  run_forward(graph, program.subgraph, full, cpu_backend(), options);
  TensorMap reference = seeded(full);
  run_backward(graph, backward, full, reference, cpu_backend(), options);

  std::unordered_set<int> keep(program.saved.begin(), program.saved.end());
  keep.insert(program.loss);
  TensorMap values = feeds;
  ExecutionOptions freeing = options;
  freeing.keep = &keep;
  run_forward(graph, program.subgraph, values, cpu_backend(), freeing);
  release_unsaved(graph, values, keep);
  std::vector<int> kept;
  for (const auto& [id, tensor] : values)
    if (tensor.defined() && is_microbatch_value(graph, id) && id != program.loss) kept.push_back(id);
  const auto cost = partition::make_analytic_cost_model(graph, partition::DeviceSpec{});
  const partition::StageRecomputation predicted =
      partition::stage_recomputation(graph, *cost, plan.stages[0], batch, false, cost->measure(stage.tasks, batch));
  EXPECT_EQ(partition::activation_bytes_of(graph, kept, batch, false), predicted.checkpoint_bytes) << name;
  EXPECT_LT(predicted.checkpoint_bytes, cost->measure(stage.tasks, batch).activation_bytes) << name;

  TensorMap grads = seeded(values);
  run_backward_recomputing(graph, backward, program.segments, values, grads, cpu_backend(), options);
  for (int p : backward.parameter_grads) {
    const Tensor& x = reference.at(p);
    const Tensor& y = grads.at(p);
    ASSERT_EQ(x.nbytes(), y.nbytes());
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0)
        << name << ": gradient of " << graph.value(p).name << " differs with recomputation";
  }
}

TEST(ActivationMemory, RecomputationKeepsGradientsBitIdentical) {
  for (const std::string type : {"gpt", "bert"}) {
    const ModelConfig config = small_transformer(type, 3);
    expect_recomputation_keeps_gradients(config, RecomputePolicy::Layers, 1, 2);
    expect_recomputation_keeps_gradients(config, RecomputePolicy::Layers, 2, 2);
    expect_recomputation_keeps_gradients(config, RecomputePolicy::Selective, 1, 2);
  }
  expect_recomputation_keeps_gradients(small_resnet(), RecomputePolicy::Layers, 1, 2);
}

// The segments: per-layer blocks follow the layer names; selective finds one attention core per
// layer (QKᵀ to ×V, five tasks with dropout), none in the fused form.
TEST(ActivationMemory, RecomputedSegmentsOfEachPolicy) {
  ModelConfig gpt = small_transformer("gpt", 3);
  const Graph graph = build_model(gpt);
  const std::vector<int> layers = tasks_of_layers(graph, {"h.0", "h.1", "h.2"});
  PlanStage stage;
  stage.tasks = layers;
  stage.recompute = RecomputePolicy::Layers;
  EXPECT_EQ(recomputed_segments(graph, stage).size(), 3u);
  stage.recompute_layers = 2;
  const std::vector<std::vector<int>> pairs = recomputed_segments(graph, stage);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(layer_of(graph.task(pairs[1].front()).name), "h.2");
  stage.recompute = RecomputePolicy::Selective;
  const std::vector<std::vector<int>> cores = recomputed_segments(graph, stage);
  ASSERT_EQ(cores.size(), 3u);
  for (const std::vector<int>& core : cores) {
    ASSERT_EQ(core.size(), 4u);  // scores (scaled by the GEMM's alpha), softmax, dropout, context
    EXPECT_EQ(graph.task(core.front()).op, OpType::MatMul);
    EXPECT_EQ(graph.task(core[1]).op, OpType::Softmax);
    EXPECT_EQ(graph.task(core[2]).op, OpType::Dropout);
    EXPECT_EQ(graph.task(core.back()).op, OpType::MatMul);
  }
  gpt.fused_attention = true;
  const Graph fused = build_model(gpt);
  stage.tasks = tasks_of_layers(fused, {"h.0", "h.1", "h.2"});
  EXPECT_TRUE(recomputed_segments(fused, stage).empty());
  EXPECT_THROW(layer_checkpoint_blocks(graph, layers, 0), Error);
}

// What the backward reads, op by op, as the kernels do (a few ops spelled out as a guard against a
// silent change of the declarations).
TEST(ActivationMemory, SavedTensorDeclarations) {
  EXPECT_TRUE(op_schema(OpType::MatMul).input_is_saved(0));
  EXPECT_TRUE(op_schema(OpType::MatMul).input_is_saved(1));
  EXPECT_FALSE(op_schema(OpType::MatMul).output_is_saved(0));
  EXPECT_TRUE(op_schema(OpType::Gelu).input_is_saved(0));
  EXPECT_FALSE(op_schema(OpType::Gelu).output_is_saved(0));
  EXPECT_FALSE(op_schema(OpType::Softmax).input_is_saved(0));
  EXPECT_TRUE(op_schema(OpType::Softmax).output_is_saved(0));
  EXPECT_FALSE(op_schema(OpType::Add).input_is_saved(0));
  EXPECT_FALSE(op_schema(OpType::Add).input_is_saved(1));
  EXPECT_FALSE(op_schema(OpType::Dropout).input_is_saved(0));
  EXPECT_FALSE(op_schema(OpType::Dropout).output_is_saved(0));
  EXPECT_TRUE(op_schema(OpType::Tanh).output_is_saved(0));
  EXPECT_FALSE(op_schema(OpType::Tanh).input_is_saved(0));
}

TEST(ActivationMemory, ShapeOnlyTensorKeepsShapeAndRefusesData) {
  const Tensor t = Tensor::zeros({2, 3});
  const Tensor placeholder = t.shape_only();
  EXPECT_FALSE(placeholder.defined());
  EXPECT_EQ(placeholder.shape(), t.shape());
  EXPECT_EQ(placeholder.nbytes(), t.nbytes());
  EXPECT_THROW(placeholder.data<float>(), Error);
  EXPECT_THROW(placeholder.raw_data(), Error);
}

}  // namespace
}  // namespace partrain
