// The tensor-parallel graph transformation (graph/tensor_parallel.h): local shapes, FLOPs per rank of
// the split GEMMs (total / t), the inserted communication tasks and their all-reduce volumes, clear
// errors, and the shard copies that checkpoints and initial values go through. The numbers of a
// transformed graph (loss, gradients) are checked against the one-device graph on real MPI ranks in
// ctest/mpi/test_tensor_parallel_graph.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "app/planning.h"
#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/layers.h"
#include "models/model.h"
#include "partition/common/cost_model.h"
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
  // A vocabulary that t does not divide is padded (VocabularyIsPaddedAsMegatronPadsIt), not an error.
  config = testing::small_transformer_config("gpt");
  config.vocab = 510;
  const Graph padded = tensor_parallel_graph(build_model(config), 4);
  EXPECT_EQ(padded.value(padded.value_id("transformer.wte.weight")).sharding.padding, 2);
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

// ---------------------------------------------------------------------------------------------
// Vocabulary padding (Megatron-LM's --make-vocab-size-divisible-by): the numbers (loss and gradients
// of a padded graph against the unpadded one-device model) are checked on MPI ranks in
// ctest/mpi/test_tensor_parallel_graph.cpp and in training (validation, vocabulary 8000).
// ---------------------------------------------------------------------------------------------

const Shape& shape_of(const Graph& graph, const std::string& value) { return graph.value(graph.value_id(value)).type.shape; }

const Task& only_task(const Graph& graph, OpType op) {
  const Task* found = nullptr;
  for (const Task& task : graph.tasks())
    if (task.op == op) {
      EXPECT_EQ(found, nullptr) << "two " << op_name(op) << " tasks";
      found = &task;
    }
  PARTRAIN_CHECK(found != nullptr, "no " << op_name(op) << " task");
  return *found;
}

TEST(TensorParallelGraph, VocabularyIsPaddedAsMegatronPadsIt) {
  // GPT-2's 50,257 tokens: rows up to a multiple of 128·t, at the end of the last ranks' parts.
  ModelConfig config = testing::small_transformer_config("gpt");
  config.heads = 8;
  config.vocab = 50257;
  const Graph whole = build_model(config);
  for (const auto& [t, padded] : {std::pair<int, std::int64_t>{2, 50432}, {4, 50688}, {8, 51200}}) {
    SCOPED_TRACE("t=" + std::to_string(t));
    const Graph part = tensor_parallel_graph(whole, t);
    const Value& wte = part.value(part.value_id("transformer.wte.weight"));
    EXPECT_EQ(wte.type.shape, (Shape{padded / t, 64}));
    EXPECT_EQ(wte.sharding.padding, padded - 50257);
    EXPECT_EQ(whole_shape(wte), (Shape{50257, 64}));  // what checkpoints and exports hold
    // The lookup and the loss know the real vocabulary; the logits are the padded rank's part.
    EXPECT_EQ(only_task(part, OpType::VocabParallelCrossEntropy).attributes.get_int("vocab_size"), 50257);
    EXPECT_EQ(only_task(part, OpType::VocabParallelEmbedding).attributes.get_int("vocab_size"), 50257);
    EXPECT_EQ(shape_of(part, "lm_head"), (Shape{kBatch, 16, padded / t}));
    // The LM head's FLOPs are those of the padded vocabulary: each rank computes its padded part.
    EXPECT_DOUBLE_EQ(flops_of(part, OpType::MatMul, "lm_head") * t * 50257,
                     flops_of(whole, OpType::MatMul, "lm_head") * static_cast<double>(padded));
  }
  // vocab_divisible_by = 1: the least padding, to a multiple of t.
  config.vocab_divisible_by = 1;
  const Graph least = tensor_parallel_graph(build_model(config), 4);
  EXPECT_EQ(least.value(least.value_id("transformer.wte.weight")).sharding.padding, 3);
  // A vocabulary that divides by vocab_divisible_by·t is not padded: the graph is the one without
  // padding (no vocab_size attributes), and t = 1 never pads.
  config.vocab = 1024;
  config.vocab_divisible_by = 128;
  const Graph unpadded = tensor_parallel_graph(build_model(config), 8);
  EXPECT_EQ(unpadded.value(unpadded.value_id("transformer.wte.weight")).sharding.padding, 0);
  EXPECT_FALSE(only_task(unpadded, OpType::VocabParallelCrossEntropy).attributes.has("vocab_size"));
  config.vocab = 50257;
  EXPECT_EQ(tensor_parallel_graph(build_model(config), 1).hash(), build_model(config).hash());
}

TEST(TensorParallelGraph, BertDecoderBiasIsPaddedLikeTheTable) {
  ModelConfig config = testing::small_transformer_config("bert");
  config.vocab = 30522;
  const Graph whole = build_model(config);
  for (bool sequence_parallel : {false, true}) {
    const Graph part = tensor_parallel_graph(whole, 4, sequence_parallel);
    const Value& table = part.value(part.value_id("bert.embeddings.word_embeddings.weight"));
    const Value& bias = part.value(part.value_id("cls.predictions.bias"));
    EXPECT_EQ(table.type.shape, (Shape{30720 / 4, 64}));  // 30,720 = 60 · 512
    EXPECT_EQ(bias.type.shape, (Shape{30720 / 4}));
    EXPECT_EQ(bias.sharding, table.sharding);
    EXPECT_EQ(bias.sharding.padding, 198);
    EXPECT_EQ(whole_shape(bias), (Shape{30522}));
    EXPECT_EQ(only_task(part, OpType::VocabParallelCrossEntropy).attributes.get_int("vocab_size"), 30522);
  }
}

TEST(TensorParallelGraph, PaddedLogitsReachOnlyElementWiseOpsAndTheLoss) {
  // A hand-made head whose padded logits go through a Softmax: it would normalise over the padding.
  Graph graph;
  const int ids = graph.add_input("input_ids", {kBatch, 3}, DType::I64);
  const int table = graph.add_parameter("table", {10, 4});
  const int embedded = graph.add(OpType::Gather, "embed", {table, ids});
  graph.hint_tensor_parallel(embedded, layers::vocabulary_parallel(1));
  const int logits = graph.add(OpType::MatMul, "head", {embedded, table}, {{"trans_b", std::int64_t{1}}});
  graph.hint_tensor_parallel(logits, layers::vocabulary_parallel(1));
  graph.mark_output(graph.add(OpType::Softmax, "probabilities", {logits}));
  try {
    tensor_parallel_graph(graph, 4);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("task 'probabilities' (Softmax): 'head' holds the padded vocabulary"), std::string::npos)
        << error.message();
  }
  // Divisible (t = 2): nothing is padded and the split logits are an error as before (a graph output).
  EXPECT_THROW(tensor_parallel_graph(graph, 2), Error);
}

TEST(TensorParallelGraph, PaddedShardsHoldZerosAndRoundTripWithoutThem) {
  // Whole [5, 2] padded by 3 rows to 8 over 2 ranks: rank 0 rows 0-3, rank 1 row 4 and 3 zero rows.
  std::vector<float> values(10);
  for (int i = 0; i < 10; ++i) values[i] = static_cast<float>(i + 1);
  const Tensor whole = Tensor::from_vector<float>({5, 2}, values);
  Sharding sharding{0, 2, 1};
  sharding.padding = 3;
  EXPECT_EQ(shard_of(whole, sharding, 0).to_float_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(shard_of(whole, sharding, 1).to_float_vector(), (std::vector<float>{9, 10, 0, 0, 0, 0, 0, 0}));
  const Tensor rebuilt = Tensor::zeros({5, 2});
  for (int rank = 0; rank < 2; ++rank) {
    Tensor part = shard_of(whole, sharding, rank);
    part.data<float>()[7] = 99.f;  // padding (rank 1) is left out
    if (rank == 0) part.data<float>()[7] = 8.f;
    place_shard(rebuilt, part, sharding, rank);
  }
  EXPECT_EQ(rebuilt.to_float_vector(), values);
  // A part wholly in the padding (5 + 11 rows over 4 ranks: ranks 2 and 3).
  sharding = Sharding{0, 4, 1};
  sharding.padding = 11;
  EXPECT_EQ(shard_of(whole, sharding, 1).to_float_vector(), (std::vector<float>{9, 10, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(shard_of(whole, sharding, 3).to_float_vector(), std::vector<float>(8, 0.f));
  // The 1-D decoder bias, and a padding that does not make the size divide: an error.
  const Tensor bias = Tensor::from_vector<float>({3}, {1, 2, 3});
  sharding = Sharding{0, 2, 1};
  sharding.padding = 1;
  EXPECT_EQ(shard_of(bias, sharding, 1).to_float_vector(), (std::vector<float>{3, 0}));
  sharding.padding = 2;
  EXPECT_THROW(shard_of(bias, sharding, 0), Error);
}

// A group of one rank: the collectives are identities.
class OneRankGroup final : public TensorParallelGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(const Tensor&, Reduction) override {}
  void all_gather(const Tensor& input, const Tensor& output) override {
    std::memcpy(output.raw_data(), input.raw_data(), input.nbytes());
  }
  void reduce_scatter(const Tensor& input, const Tensor& output) override {
    std::memcpy(output.raw_data(), input.raw_data(), input.nbytes());
  }
};

TEST(VocabParallelCrossEntropy, PaddedClassesTakeNoPartInTheLossOrGradient) {
  // Logits over 10 classes of which 7 are real (vocab_size 7): the loss and the real classes'
  // gradients are SoftmaxCrossEntropy's over the first 7, whatever the padding logits hold (here
  // large, which would dominate an unmasked softmax), and the padding gets a zero gradient.
  CpuBackend backend;
  OneRankGroup group;
  const std::int64_t rows = 6, classes = 10, real = 7;
  std::vector<float> padded(static_cast<std::size_t>(rows * classes)), unpadded;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < classes; ++j) {
      const float value = j < real ? std::sin(static_cast<float>(r * classes + j)) * 3.f : 50.f + static_cast<float>(j);
      padded[static_cast<std::size_t>(r * classes + j)] = value;
      if (j < real) unpadded.push_back(value);
    }
  const Tensor labels = Tensor::from_vector<std::int64_t>({rows}, {0, 6, -100, 3, 6, 1});
  const Tensor padded_logits = Tensor::from_vector<float>({rows, classes}, padded);
  const Tensor real_logits = Tensor::from_vector<float>({rows, real}, unpadded);

  const Attributes vocab{{"vocab_size", real}};
  const KernelContext parallel{vocab, backend, true, {}, &group};
  const std::vector<Tensor> parallel_out{Tensor::empty({}), Tensor::empty({rows})};
  const std::vector<Tensor> parallel_in{padded_logits, labels};
  backend.forward(OpType::VocabParallelCrossEntropy, parallel, parallel_in, parallel_out);
  const Tensor parallel_grad = Tensor::empty({rows, classes});
  const std::vector<Tensor> loss_grad{Tensor::full({}, 1.0), Tensor::zeros({rows})};
  backend.backward(OpType::VocabParallelCrossEntropy, parallel, parallel_in, parallel_out, loss_grad,
                   std::vector<Tensor>{parallel_grad, Tensor()});

  const Attributes none;
  const KernelContext plain{none, backend, true, {}, nullptr};
  const std::vector<Tensor> plain_out{Tensor::empty({}), Tensor::empty({rows})};
  const std::vector<Tensor> plain_in{real_logits, labels};
  backend.forward(OpType::SoftmaxCrossEntropy, plain, plain_in, plain_out);
  const Tensor plain_grad = Tensor::empty({rows, real});
  backend.backward(OpType::SoftmaxCrossEntropy, plain, plain_in, plain_out, loss_grad,
                   std::vector<Tensor>{plain_grad, Tensor()});

  EXPECT_NEAR(parallel_out[0].to_float_vector()[0], plain_out[0].to_float_vector()[0], 1e-6);
  const std::vector<float> got = parallel_grad.to_float_vector(), expected = plain_grad.to_float_vector();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < classes; ++j) {
      const float value = got[static_cast<std::size_t>(r * classes + j)];
      if (j < real) {
        EXPECT_NEAR(value, expected[static_cast<std::size_t>(r * real + j)], 1e-7) << r << ", " << j;
      } else {
        EXPECT_EQ(value, 0.f) << r << ", " << j;
      }
    }
  // A label in the padding is as wrong as one beyond it; so is a vocab_size beyond the classes.
  const Tensor bad = Tensor::from_vector<std::int64_t>({rows}, {0, 7, 1, 1, 1, 1});
  EXPECT_THROW(backend.forward(OpType::VocabParallelCrossEntropy, parallel, std::vector<Tensor>{padded_logits, bad},
                               parallel_out),
               Error);
  const Attributes too_many{{"vocab_size", std::int64_t{11}}};
  EXPECT_THROW(backend.forward(OpType::VocabParallelCrossEntropy, KernelContext{too_many, backend, true, {}, &group},
                               parallel_in, parallel_out),
               Error);
  // The embedding: an index in the padding rows is an error.
  const Tensor table = Tensor::zeros({10, 3});
  const std::vector<Tensor> embedded{Tensor::empty({2, 3})};
  EXPECT_NO_THROW(backend.forward(OpType::VocabParallelEmbedding, parallel,
                                  std::vector<Tensor>{table, Tensor::from_vector<std::int64_t>({2}, {0, 6})}, embedded));
  EXPECT_THROW(backend.forward(OpType::VocabParallelEmbedding, parallel,
                               std::vector<Tensor>{table, Tensor::from_vector<std::int64_t>({2}, {0, 7})}, embedded),
               Error);
}

// ---------------------------------------------------------------------------------------------
// Sequence parallelism (Korthikanti et al. 2022 §4.2.2): the numbers are checked against one device
// on MPI ranks (ctest/mpi/test_tensor_parallel_graph.cpp) and in training (validation).
// ---------------------------------------------------------------------------------------------

TEST(SequenceParallelGraph, GptResidualStreamHoldsItsPartOfTheSequence) {
  const ModelConfig config = testing::small_transformer_config("gpt");  // hidden 64, seq 16, vocabulary 512
  const Graph whole = build_model(config);
  for (int t : {2, 4}) {
    SCOPED_TRACE("t=" + std::to_string(t));
    const Graph part = tensor_parallel_graph(whole, t, true);
    EXPECT_TRUE(is_sequence_parallel(part));
    EXPECT_FALSE(is_sequence_parallel(tensor_parallel_graph(whole, t)));
    const std::int64_t s = 16 / t;
    // The embeddings: the vocabulary-parallel lookup reduce-scattered, the position vectors scattered.
    EXPECT_EQ(shape_of(part, "transformer.wte.reduce_scatter"), (Shape{kBatch, s, 64}));
    EXPECT_EQ(shape_of(part, "transformer.wpe.sequence_parallel_scatter"), (Shape{s, 64}));
    EXPECT_EQ(shape_of(part, "transformer.embeddings"), (Shape{kBatch, s, 64}));
    for (int layer = 0; layer < 2; ++layer) {
      const std::string prefix = "transformer.h." + std::to_string(layer);
      // The residual stream, LayerNorms and dropouts on [B, S/t, H]; the GEMMs read [B, S, H].
      for (const char* value : {".ln_1", ".attn.residual", ".ln_2", ".mlp.residual", ".attn.c_proj.reduce_scatter",
                                ".attn.c_proj.add_bias", ".mlp.c_proj.add_bias"})
        EXPECT_EQ(shape_of(part, prefix + value), (Shape{kBatch, s, 64})) << prefix + value;
      EXPECT_EQ(shape_of(part, prefix + ".ln_1.sequence_parallel_all_gather"), (Shape{kBatch, 16, 64}));
      EXPECT_EQ(shape_of(part, prefix + ".ln_2.sequence_parallel_all_gather"), (Shape{kBatch, 16, 64}));
      EXPECT_EQ(shape_of(part, prefix + ".attn.c_attn"), (Shape{kBatch, 16, 3 * 64 / t}));
      EXPECT_EQ(shape_of(part, prefix + ".mlp.c_fc"), (Shape{kBatch, 16, 128 / t}));  // intermediate 128
      // The c_attn Gemm reads the all-gathered LayerNorm output.
      const Task& c_attn = part.task(part.value(part.value_id(prefix + ".attn.c_attn")).producer);
      EXPECT_EQ(part.value(c_attn.inputs[0]).name, prefix + ".ln_1.sequence_parallel_all_gather");
    }
    // The LM head reads the whole sequence: ln_f on the part, all-gathered.
    EXPECT_EQ(shape_of(part, "transformer.ln_f"), (Shape{kBatch, s, 64}));
    EXPECT_EQ(shape_of(part, "lm_head"), (Shape{kBatch, 16, 512 / t}));

    const std::map<OpType, int> ops = count_ops(part);
    EXPECT_EQ(ops.at(OpType::SequenceParallelAllGather), 2 * 2 + 1);      // QKV and MLP-up per layer, the LM head
    EXPECT_EQ(ops.at(OpType::SequenceParallelReduceScatter), 2 * 2 + 1);  // attention output and MLP-down, the embedding
    EXPECT_EQ(ops.at(OpType::SequenceParallelScatter), 1);                // the position vectors
    EXPECT_EQ(ops.count(OpType::SequenceParallelGather), 0u);
    EXPECT_EQ(ops.count(OpType::TensorParallelCopy), 0u);
    EXPECT_EQ(ops.count(OpType::TensorParallelAllReduce), 0u);

    // Parameters keep names and whole shapes; LayerNorms and row-parallel biases are sequence parallel.
    std::vector<std::string> sequence_parallel;
    for (int value : sequence_parallel_parameters(part)) sequence_parallel.push_back(part.value(value).name);
    const std::vector<std::string> expected = {
        "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias", "transformer.h.0.attn.c_proj.bias",
        "transformer.h.0.ln_2.weight", "transformer.h.0.ln_2.bias", "transformer.h.0.mlp.c_proj.bias",
        "transformer.h.1.ln_1.weight", "transformer.h.1.ln_1.bias", "transformer.h.1.attn.c_proj.bias",
        "transformer.h.1.ln_2.weight", "transformer.h.1.ln_2.bias", "transformer.h.1.mlp.c_proj.bias",
        "transformer.ln_f.weight",     "transformer.ln_f.bias"};
    std::vector<std::string> sorted_actual = sequence_parallel, sorted_expected = expected;
    std::sort(sorted_actual.begin(), sorted_actual.end());
    std::sort(sorted_expected.begin(), sorted_expected.end());
    EXPECT_EQ(sorted_actual, sorted_expected);
    for (int value : part.parameters()) {
      const Value& v = part.value(value);
      EXPECT_EQ(whole_shape(v), whole.value(whole.value_id(v.name)).type.shape) << v.name;
      EXPECT_FALSE(v.sharding.sharded() && v.sharding.sequence_parallel) << v.name;
    }
    // Each rank normalises its 1/t of the positions.
    const auto layer_norm_flops = [](const Graph& graph) { return flops_of(graph, OpType::LayerNorm, "transformer.h.0.ln_1"); };
    EXPECT_DOUBLE_EQ(layer_norm_flops(part) * t, layer_norm_flops(whole));
    EXPECT_NE(part.hash(), tensor_parallel_graph(whole, t).hash());
  }
  // Degree 1: nothing to split.
  EXPECT_EQ(tensor_parallel_graph(whole, 1, true).hash(), whole.hash());
}

TEST(SequenceParallelGraph, BertGathersForThePoolerAndScattersTheEmbeddings) {
  const ModelConfig config = testing::small_transformer_config("bert");
  const Graph part = tensor_parallel_graph(build_model(config), 2, true);
  const std::map<OpType, int> ops = count_ops(part);
  EXPECT_EQ(ops.at(OpType::SequenceParallelAllGather), 2 * 2 + 1);      // shared QKV input, MLP-up; the MLM decoder
  EXPECT_EQ(ops.at(OpType::SequenceParallelReduceScatter), 2 * 2 + 1);  // the word embeddings
  EXPECT_EQ(ops.at(OpType::SequenceParallelScatter), 2);                // token types and positions
  EXPECT_EQ(ops.at(OpType::SequenceParallelGather), 1);                 // the pooler's first token
  EXPECT_EQ(shape_of(part, "bert.embeddings.LayerNorm"), (Shape{kBatch, 8, 64}));
  EXPECT_EQ(shape_of(part, "bert.encoder.layer.1.output.LayerNorm"), (Shape{kBatch, 8, 64}));
  // The MLM transform runs per token on the part; its dense layer's parameters are sequence parallel.
  EXPECT_EQ(shape_of(part, "cls.predictions.transform.LayerNorm"), (Shape{kBatch, 8, 64}));
  EXPECT_TRUE(part.value(part.value_id("cls.predictions.transform.dense.weight")).sharding.sequence_parallel);
  // The pooler reads token 0 of the whole sequence; its parameters are replicated as before.
  EXPECT_EQ(shape_of(part, "bert.encoder.layer.1.output.LayerNorm.sequence_parallel_gather"), (Shape{kBatch, 16, 64}));
  EXPECT_FALSE(part.value(part.value_id("bert.pooler.dense.weight")).sharding.sequence_parallel);
  EXPECT_TRUE(part.value(part.value_id("bert.embeddings.LayerNorm.weight")).sharding.sequence_parallel);
  // The data inputs stay whole.
  EXPECT_EQ(shape_of(part, "input_ids"), (Shape{kBatch, 16}));
  EXPECT_EQ(shape_of(part, "attention_mask"), (Shape{kBatch, 1, 1, 16}));
}

// The all-gathers and reduce-scatters move (t − 1)/t of the whole tensor per rank, half an
// all-reduce: a layer moves the bytes of plain tensor parallelism in twice as many collectives.
TEST(SequenceParallelGraph, CommunicationVolumesAreHalfAnAllReduceEach) {
  const Graph whole = build_model(testing::small_transformer_config("gpt"));
  const Graph plain = tensor_parallel_graph(whole, 2);
  const Graph part = tensor_parallel_graph(whole, 2, true);
  const double hidden_bytes = 16.0 * 64 * 4;  // [1, 16, 64] f32
  for (const Task& task : part.tasks()) {
    if (task.op == OpType::SequenceParallelAllGather || task.op == OpType::SequenceParallelReduceScatter) {
      EXPECT_EQ(task.cost.forward_allreduce_bytes, hidden_bytes / 2) << task.name;
      EXPECT_EQ(task.cost.backward_allreduce_bytes, hidden_bytes / 2) << task.name;
    }
    if (task.op == OpType::SequenceParallelScatter) {  // the [16, 64] position vectors: all-gathered backward
      EXPECT_EQ(task.cost.forward_allreduce_bytes, 0) << task.name;
      EXPECT_EQ(task.cost.backward_allreduce_bytes, hidden_bytes / 2) << task.name;
    }
    if (task.op >= OpType::SequenceParallelAllGather && task.op <= OpType::SequenceParallelGather) {
      EXPECT_EQ(task.cost.forward_flops, 0) << task.name;
    }
  }
  const auto layer = [](const Graph& graph) {
    std::vector<int> tasks;
    for (const Task& task : graph.tasks())
      if (task.name.starts_with("transformer.h.0.")) tasks.push_back(task.id);
    return tasks;
  };
  for (std::int64_t batch : {1, 3}) {
    const partition::TensorParallelTraffic tensor = partition::tensor_parallel_traffic(plain, layer(plain), batch);
    const partition::TensorParallelTraffic sequence = partition::tensor_parallel_traffic(part, layer(part), batch);
    EXPECT_EQ(sequence.forward_bytes, tensor.forward_bytes);
    EXPECT_EQ(sequence.backward_bytes, tensor.backward_bytes);
    EXPECT_EQ(tensor.forward_bytes, 2 * hidden_bytes * batch);
    EXPECT_EQ(tensor.forward_allreduces, 2);
    EXPECT_EQ(sequence.forward_allreduces, 4);
    EXPECT_EQ(sequence.backward_allreduces, 4);
  }
  // Sub-pipelined TMP overlaps the deferrable f and g all-reduces; sequence parallelism's block.
  partition::DeviceSpec device;
  device.link_bandwidth = 1e6;  // communication comparable to the computation
  device.flops_per_second = 1e9;
  const auto pass = [&](const Graph& graph, bool sub_pipelined) {
    return partition::make_analytic_cost_model(graph, device, false, sub_pipelined)->measure(layer(graph), 4).forward_seconds;
  };
  EXPECT_LT(pass(plain, true), pass(plain, false));
  EXPECT_EQ(pass(part, true), pass(part, false));
}

TEST(SequenceParallelGraph, ClearErrors) {
  ModelConfig config = testing::small_transformer_config("gpt");
  config.seq_len = 18;
  try {
    tensor_parallel_graph(build_model(config), 4, true);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("sequence length (18) is not a multiple of the tensor-parallel degree 4"),
              std::string::npos)
        << error.message();
  }
  EXPECT_NO_THROW(tensor_parallel_graph(build_model(config), 4));  // without sequence parallelism it is fine
  // A LayerNorm parameter read on the whole sequence and on the rank's part: its gradient could not
  // be summed over the group.
  Graph graph;
  const int x = graph.add_input("x", {kBatch, 8, 16});
  const int shared = layers::layer_norm(graph, "first", x, 16, 1e-5);
  int y = layers::linear(graph, "up", shared, 16, 32, false, layers::column_parallel());
  y = layers::linear(graph, "down", y, 32, 16, false, layers::row_parallel());
  const int weight = graph.value_id("first.weight"), bias = graph.value_id("first.bias");
  graph.mark_output(graph.add(OpType::LayerNorm, "second", {y, weight, bias}, {{"eps", 1e-5}}));
  EXPECT_NO_THROW(tensor_parallel_graph(graph, 2));
  try {
    tensor_parallel_graph(graph, 2, true);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("parameter 'first.weight' is used with two different shardings (on the rank's part of "
                                   "the sequence and on the whole sequence)"),
              std::string::npos)
        << error.message();
  }
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
  EXPECT_EQ(&provider(1, false), &graphs.model());
  EXPECT_EQ(&provider(2, false), &two);
  const Graph& four = provider(4, false);
  EXPECT_EQ(&graphs.of_degree(4), &four);
  EXPECT_EQ(four.hash(), tensor_parallel_graph(graphs.model(), 4).hash());
  // With sequence parallelism: another graph of the same degree, also built once.
  const Graph& two_sequence = graphs.of_degree(2, true);
  EXPECT_EQ(&graphs.of_degree(2, true), &two_sequence);
  EXPECT_NE(&two_sequence, &two);
  EXPECT_TRUE(is_sequence_parallel(two_sequence));
  EXPECT_EQ(&provider(2, true), &two_sequence);
  EXPECT_EQ(&provider(1, true), &graphs.model());
  config.model.seq_len = 18;
  try {
    graphs.of_degree(4, true);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("small.toml: [model] seq_len = 18 is not a multiple of [parallel] tensor_parallel = 4"),
              std::string::npos)
        << error.message();
  }
  // A vocabulary no degree divides (GPT-2's) is padded, not refused: the graph holds 50,432 rows.
  config.model.seq_len = 16;
  config.model.vocab = 50257;
  app::PlannedGraphs gpt2(config);
  const Graph& padded = gpt2.of_degree(2);
  EXPECT_EQ(whole_shape(padded.value(padded.value_id("transformer.wte.weight"))), (Shape{50257, 64}));
  EXPECT_EQ(padded.value(padded.value_id("transformer.wte.weight")).type.shape, (Shape{50432 / 2, 64}));
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
