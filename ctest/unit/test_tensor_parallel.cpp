// The tensor-parallel graph transformation (graph/tensor_parallel.h): local shapes, FLOPs per rank of
// the split GEMMs (total / t), the inserted communication tasks and their all-reduce volumes, clear
// errors, and the shard copies that checkpoints and initial values go through. The numbers of a
// transformed graph (loss, gradients) are checked against the one-device graph on real MPI ranks in
// ctest/mpi/test_tensor_parallel_graph.cpp.
#include <gtest/gtest.h>

#include <map>

#include "app/planning.h"
#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "models/model.h"
#include "support/tiny_models.h"

namespace partrain {
namespace {


double flops_of(const Graph& graph, OpType op, const std::string& name_part, const std::string& also = "") {
  double total = 0;
  for (const Task& task : graph.tasks())
    if (task.op == op && task.name.find(name_part) != std::string::npos && task.name.find(also) != std::string::npos)
      total += task.cost.forward_flops;
  return total;
}

std::map<OpType, int> count_ops(const Graph& graph) {
  std::map<OpType, int> counts;
  for (const Task& task : graph.tasks()) ++counts[task.op];
  return counts;
}

TEST(TensorParallelGraph, GptShapesAndShardings) {
  const ModelConfig config = testing::small_transformer_config("gpt");
  const Graph whole = build_model(config);
  const Graph part = tensor_parallel_graph(whole, 4);
  auto parameter = [&](const std::string& name) { return part.value(part.value_id(name)); };
  // c_attn fuses query, key and value: each rank holds a quarter of each of the three blocks.
  EXPECT_EQ(parameter("transformer.h.0.attn.c_attn.weight").type.shape, (Shape{64, 48}));
  EXPECT_EQ(parameter("transformer.h.0.attn.c_attn.weight").sharding, (Sharding{1, 4, 3}));
  EXPECT_EQ(parameter("transformer.h.0.attn.c_attn.bias").sharding, (Sharding{0, 4, 3}));
  EXPECT_EQ(parameter("transformer.h.0.attn.c_proj.weight").type.shape, (Shape{16, 64}));  // Conv1D [in, out]: rows split
  EXPECT_EQ(parameter("transformer.h.0.attn.c_proj.bias").type.shape, (Shape{64}));        // added after the all-reduce
  EXPECT_FALSE(parameter("transformer.h.0.attn.c_proj.bias").sharding.sharded());
  EXPECT_EQ(parameter("transformer.h.1.mlp.c_fc.weight").type.shape, (Shape{64, 32}));
  EXPECT_EQ(parameter("transformer.h.1.mlp.c_proj.weight").type.shape, (Shape{32, 64}));
  EXPECT_EQ(parameter("transformer.wte.weight").type.shape, (Shape{128, 64}));  // vocabulary rows, tied with the LM head
  EXPECT_EQ(parameter("transformer.wpe.weight").type.shape, (Shape{32, 64}));
  EXPECT_EQ(parameter("transformer.ln_f.weight").type.shape, (Shape{64}));
  EXPECT_EQ(whole_shape(parameter("transformer.wte.weight")), (Shape{512, 64}));
  // Heads: 1 of 4 per rank.
  EXPECT_EQ(part.value(part.value_id("transformer.h.0.attn.query_heads")).type.shape, (Shape{kBatch, 1, 16, 16}));
  // Data inputs and the loss are those of the model.
  EXPECT_EQ(part.value(part.outputs()[0]).type.shape, Shape{});
  EXPECT_EQ(part.value(part.value_id("input_ids")).kind, ValueKind::Input);
}

TEST(TensorParallelGraph, SplitGemmFlopsAreTheWholeOnesOverT) {
  for (const char* type : {"gpt", "bert"}) {
    const Graph whole = build_model(testing::small_transformer_config(type));
    for (int t : {2, 4}) {
      const Graph part = tensor_parallel_graph(whole, t);
      SCOPED_TRACE(std::string(type) + " t=" + std::to_string(t));
      for (const char* layer : {".h.0.", ".layer.0."}) {
        const double whole_flops = flops_of(whole, OpType::Gemm, layer);
        if (whole_flops == 0) continue;
        // Each rank multiplies 1/t of every split Gemm; the row-parallel biases, added once after the
        // all-reduce (the "add_bias" tasks), are the only whole work left.
        EXPECT_DOUBLE_EQ(flops_of(part, OpType::Gemm, layer) * t + flops_of(part, OpType::Add, layer, "add_bias"), whole_flops);
        EXPECT_DOUBLE_EQ(flops_of(part, OpType::MatMul, layer) * t, flops_of(whole, OpType::MatMul, layer));
      }
      // The vocabulary projection (lm_head / MLM decoder) is split too.
      const char* head = std::string(type) == "gpt" ? "lm_head" : "cls.predictions.decoder";
      EXPECT_DOUBLE_EQ(flops_of(part, OpType::MatMul, head) * t, flops_of(whole, OpType::MatMul, head));
      // Parameters: the split ones sum to the whole model over the ranks.
      std::int64_t total = 0;
      for (int value : part.parameters()) {
        const Value& v = part.value(value);
        total += numel(v.type.shape) * (v.sharding.sharded() ? t : 1);
      }
      EXPECT_EQ(total, whole.parameter_count());
    }
  }
}

TEST(TensorParallelGraph, InsertsMegatronsConjugateCommunication) {
  const ModelConfig config = testing::small_transformer_config("bert");
  const Graph part = tensor_parallel_graph(build_model(config), 2);
  const std::map<OpType, int> ops = count_ops(part);
  // Per layer: one f before the (shared) QKV input and one before MLP-up; one g after each row-parallel
  // Gemm. Plus the head: f before the decoder; the embedding's g; the vocabulary-parallel ops.
  EXPECT_EQ(ops.at(OpType::TensorParallelCopy), 2 * 2 + 1);
  EXPECT_EQ(ops.at(OpType::TensorParallelAllReduce), 2 * 2 + 1);
  EXPECT_EQ(ops.at(OpType::VocabParallelEmbedding), 1);
  EXPECT_EQ(ops.at(OpType::VocabParallelCrossEntropy), 1);
  EXPECT_EQ(ops.count(OpType::SoftmaxCrossEntropy), 1u);  // the NSP loss stays whole
  // All-reduce volumes at batch 1: f all-reduces its input's gradient backward, g its output forward.
  const double hidden_bytes = 16.0 * 64 * 4;
  for (const Task& task : part.tasks()) {
    if (task.op == OpType::TensorParallelCopy) {
      EXPECT_EQ(task.cost.forward_allreduce_bytes, 0);
      EXPECT_EQ(task.cost.backward_allreduce_bytes, hidden_bytes) << task.name;
    }
    if (task.op == OpType::TensorParallelAllReduce) {
      EXPECT_EQ(task.cost.forward_allreduce_bytes, hidden_bytes) << task.name;
      EXPECT_EQ(task.cost.backward_allreduce_bytes, 0);
    }
  }
  // The row-parallel bias is added after the all-reduce, by its own task.
  const Task& bias = part.task(part.value(part.value_id("bert.encoder.layer.0.output.dense.bias")).consumers.at(0));
  EXPECT_EQ(bias.name, "bert.encoder.layer.0.output.dense.add_bias");
  EXPECT_EQ(part.value(bias.inputs[0]).name, "bert.encoder.layer.0.output.dense.all_reduce");
}

TEST(TensorParallelGraph, DegreeOneIsTheModelAndHashesDiffer) {
  const Graph whole = build_model(testing::small_transformer_config("gpt"));
  EXPECT_EQ(tensor_parallel_graph(whole, 1).hash(), whole.hash());
  EXPECT_NE(tensor_parallel_graph(whole, 2).hash(), whole.hash());
  EXPECT_NE(tensor_parallel_graph(whole, 2).hash(), tensor_parallel_graph(whole, 4).hash());
}

TEST(TensorParallelGraph, ClearErrors) {
  ModelConfig config = testing::small_transformer_config("gpt");
  config.heads = 2;
  try {
    tensor_parallel_graph(build_model(config), 4);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("not a multiple of the tensor-parallel degree 4"), std::string::npos) << error.message();
  }
  config = testing::small_transformer_config("gpt");
  config.vocab = 510;
  try {
    tensor_parallel_graph(build_model(config), 4);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("vocabulary size (510)"), std::string::npos) << error.message();
  }
  ModelConfig resnet;
  resnet.type = "resnet";
  resnet.depth = 18;
  resnet.image_size = 32;
  resnet.classes = 10;
  try {
    tensor_parallel_graph(build_model(resnet), 2);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("no tensor-parallel layer"), std::string::npos) << error.message();
  }
}

TEST(TensorParallelGraph, ShardsRoundTripWithFusedBlocks) {
  // A [2, 12] tensor whose columns hold 3 fused blocks of 4: rank r of 2 takes 2 columns of each.
  std::vector<float> values(24);
  for (int i = 0; i < 24; ++i) values[i] = static_cast<float>(i);
  const Tensor whole = Tensor::from_vector<float>({2, 12}, values);
  const Sharding sharding{1, 2, 3};
  const Tensor part = shard_of(whole, sharding, 1);
  EXPECT_EQ(part.shape(), (Shape{2, 6}));
  EXPECT_EQ(part.to_float_vector(), (std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23}));
  const Tensor rebuilt = Tensor::zeros({2, 12});
  for (int rank = 0; rank < 2; ++rank) place_shard(rebuilt, shard_of(whole, sharding, rank), sharding, rank);
  EXPECT_EQ(rebuilt.to_float_vector(), values);
  EXPECT_THROW(shard_of(whole, Sharding{1, 5, 1}, 0), Error);
}

// app::PlannedGraphs: each degree's graph built once and handed out again; a degree the model does
// not allow is refused with the [model] key, before any graph is built.
TEST(PlannedGraphs, EachDegreeBuiltOnce) {
  ExperimentConfig config;
  config.path = "small.toml";
  config.model = testing::small_transformer_config("gpt");
  app::PlannedGraphs graphs(config);
  EXPECT_EQ(&graphs.of_degree(1), &graphs.model());
  const Graph& two = graphs.of_degree(2);
  EXPECT_EQ(&graphs.of_degree(2), &two);
  EXPECT_EQ(two.hash(), tensor_parallel_graph(graphs.model(), 2).hash());
  // The planner's view of the same graphs: make_3d_plan and tensor_parallel_candidates ask it.
  const partition::TensorParallelGraphs provider = graphs.provider();
  EXPECT_EQ(&provider(1), &graphs.model());
  EXPECT_EQ(&provider(2), &two);
  const Graph& four = provider(4);
  EXPECT_EQ(&graphs.of_degree(4), &four);
  EXPECT_EQ(four.hash(), tensor_parallel_graph(graphs.model(), 4).hash());
  try {
    graphs.of_degree(8);  // 4 heads
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("small.toml: [model] heads = 4 is not a multiple of [parallel] tensor_parallel = 8"),
              std::string::npos)
        << error.message();
  }
}

}  // namespace
}  // namespace partrain
