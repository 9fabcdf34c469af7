// The tensor-parallel graph (graph/tensor_parallel.h) computes the one-device model's numbers: on a
// real MPI tensor-parallel group of t = 2 and 4 ranks, each rank runs its part of BERT and GPT
// (dropout on, attention dropout included) forward and backward on the same batch; the loss must
// equal the one-device graph's within 1e-5 relative and every parameter gradient, split or
// replicated, must equal the rank's part of the one-device gradient within 1e-5 (relative L2).
// The same with sequence parallelism (Korthikanti et al. 2022 §4.2.2): the gradients of the
// sequence-parallel parameters (LayerNorm, row-parallel biases) are partial on each rank and summed
// over the group first, as the executor does before the optimizer step.
// With a vocabulary that t does not divide, the graph pads it (Megatron-LM's
// --make-vocab-size-divisible-by): the padded graph must compute the unpadded one-device model's loss
// and gradients, and the padding rows' gradients must be exactly zero — also when a rank's whole part
// is padding.
// Every rank runs every test with the same collective calls (see test_communicator.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "comm/tensor_parallel_group.h"
#include "graph/interpreter.h"
#include "graph/tensor_parallel.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"
#include "support/tiny_models.h"
#include "support/mpi_test_main.h"

namespace partrain {
namespace {


// A batch of `batch` samples: random tokens, labels with ignored positions, a mask hiding the end.
TensorMap make_batch(const Graph& graph, const ModelConfig& config, std::int64_t batch) {
  std::mt19937_64 random(42);
  std::uniform_int_distribution<std::int64_t> token(0, config.vocab - 1);
  TensorMap values;
  const std::int64_t seq = config.seq_len;
  auto tokens = [&](bool ignore_some) {
    std::vector<std::int64_t> ids(static_cast<std::size_t>(batch * seq));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = ignore_some && i % 3 == 1 ? -100 : token(random);
    return Tensor::from_vector<std::int64_t>({batch, seq}, ids);
  };
  for (const Value& value : graph.values()) {
    if (value.name == "input_ids") values[value.id] = tokens(false);
    if (value.name == "labels" || value.name == "mlm_labels") values[value.id] = tokens(true);
    if (value.name == "token_type_ids") values[value.id] = Tensor::zeros({batch, seq}, DType::I64);
    if (value.name == "nsp_labels") values[value.id] = Tensor::from_vector<std::int64_t>({batch}, {0, 1, 1});
    if (value.name == "attention_mask") {
      std::vector<float> mask(static_cast<std::size_t>(batch * seq), 0.f);
      for (std::int64_t s = seq - 3; s < seq; ++s) mask[static_cast<std::size_t>(seq + s)] = -10000.f;  // sample 1: padding
      values[value.id] = Tensor::from_vector<float>({batch, 1, 1, seq}, mask);
    }
  }
  return values;
}

struct Result {
  double loss = 0;
  TensorMap gradients;  // by value id of the graph run
};

Result train_pass(const Graph& graph, TensorMap values, TensorParallelGroup* group) {
  CpuBackend backend;
  ExecutionOptions options;
  options.random.seed = 99;
  options.random.step = 3;
  options.tensor_parallel = group;
  const Subgraph whole = whole_graph(graph);
  run_forward(graph, whole, values, backend, options);
  const int loss = graph.outputs().at(0);
  TensorMap grads;
  grads[loss] = Tensor::full({}, 1.0);
  run_backward(graph, build_backward(graph, whole), values, grads, backend, options);
  Result result;
  result.loss = values.at(loss).to_float_vector().at(0);
  for (int parameter : graph.parameters()) result.gradients[parameter] = grads.at(parameter);
  return result;
}

// ‖actual − expected‖ / ‖expected‖, with an absolute floor: the key biases' gradients are zero in
// exact arithmetic (softmax ignores a constant added to every score of a row), so only rounding
// noise of ~1e-9 remains in them.
double relative_l2(const Tensor& actual, const Tensor& expected) {
  const std::vector<float> a = actual.to_float_vector(), e = expected.to_float_vector();
  double difference = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference += (double(a[i]) - e[i]) * (double(a[i]) - e[i]);
    norm += double(e[i]) * e[i];
  }
  return std::sqrt(difference) / std::max(std::sqrt(norm), 1e-4);
}

// The vocabulary of the padded cases: `vocab` rows padded to a multiple of `divisible_by` × t.
struct Vocabulary {
  std::int64_t vocab = 0;  // 0: the small model's 512, which 128 × t divides for t ≤ 4 (no padding)
  std::int64_t divisible_by = 128;
};

void expect_tensor_parallel_matches(const std::string& type, int degree, bool sequence_parallel = false,
                                    Vocabulary vocabulary = {}) {
  comm::MpiCommunicator& world = testing::mpi_world();
  std::vector<int> members;
  for (int rank = 0; rank < std::min(degree, world.size()); ++rank) members.push_back(rank);
  const std::unique_ptr<comm::Communicator> group_communicator = world.group(members);  // collective
  if (world.size() < degree || !group_communicator) return;
  comm::CommunicatorTensorParallelGroup group(*group_communicator);
  SCOPED_TRACE(type + " t=" + std::to_string(degree) + (sequence_parallel ? " sequence parallel" : "") + " rank " +
               std::to_string(group.rank()) + (vocabulary.vocab > 0 ? " vocabulary " + std::to_string(vocabulary.vocab) +
                                                                          " padded to a multiple of " +
                                                                          std::to_string(vocabulary.divisible_by * degree)
                                                                    : std::string()));

  ModelConfig config = testing::small_transformer_config(type);
  if (vocabulary.vocab > 0) config.vocab = vocabulary.vocab;
  config.vocab_divisible_by = vocabulary.divisible_by;
  const Graph whole = build_model(config);
  const Graph part = tensor_parallel_graph(whole, degree, sequence_parallel);
  ASSERT_EQ(is_sequence_parallel(part), sequence_parallel);
  const auto parameters = initialize_parameters(whole, 5);
  TensorMap whole_values = make_batch(whole, config, 3);
  for (const auto& [value, tensor] : parameters) whole_values[value] = tensor;
  TensorMap part_values = make_batch(part, config, 3);
  for (const auto& [value, tensor] : parameters) {
    const Value& v = part.value(part.value_id(whole.value(value).name));
    part_values[v.id] = shard_of(tensor, v.sharding, group.rank());
  }

  const Result reference = train_pass(whole, whole_values, nullptr);
  Result split = train_pass(part, part_values, &group);
  const std::vector<int> partial = sequence_parallel_parameters(part);
  for (int parameter : partial) group_communicator->all_reduce(split.gradients.at(parameter));
  // Every LayerNorm (2 per layer, the final or the head's one, BERT's embedding one) is read on the
  // rank's part of the sequence.
  if (sequence_parallel) {
    EXPECT_GE(partial.size(), static_cast<std::size_t>(2 * (2 * config.layers + 1)));
  }
  EXPECT_NEAR(split.loss, reference.loss, 1e-5 * std::abs(reference.loss));
  int sharded = 0, padded = 0;
  for (int parameter : part.parameters()) {
    const Value& v = part.value(parameter);
    const Tensor& expected = reference.gradients.at(whole.value_id(v.name));
    EXPECT_LE(relative_l2(split.gradients.at(parameter), shard_of(expected, v.sharding, group.rank())), 1e-5) << v.name;
    sharded += v.sharding.sharded() ? 1 : 0;
    if (v.sharding.padding == 0) continue;
    // The padding rows (the end of the padded dimension 0) get exactly zero gradients.
    ++padded;
    const std::int64_t rows = v.type.shape[0], row = numel(v.type.shape) / rows;
    const std::int64_t real = std::clamp(whole_shape(v)[0] - rows * group.rank(), std::int64_t{0}, rows);
    const std::vector<float> gradient = split.gradients.at(parameter).to_float_vector();
    for (std::int64_t i = real * row; i < rows * row; ++i)
      ASSERT_EQ(gradient[static_cast<std::size_t>(i)], 0.f) << v.name << " element " << i << " (padding)";
  }
  // GPT's tied table; BERT's table and MLM decoder bias.
  if (vocabulary.vocab > 0) {
    EXPECT_EQ(padded, type == "bert" ? 2 : 1);
  }
  EXPECT_GE(sharded, 6 * config.layers + 1);  // per layer QKV, attention output, MLP weights (and biases); the embedding
}

TEST(TensorParallelGraph, BertMatchesOneDevice) {
  expect_tensor_parallel_matches("bert", 2);
  expect_tensor_parallel_matches("bert", 4);
}

TEST(TensorParallelGraph, GptMatchesOneDevice) {
  expect_tensor_parallel_matches("gpt", 2);
  expect_tensor_parallel_matches("gpt", 4);
}

// 509 tokens: 3 rows of padding at t = 2 and 4 (512). 100 tokens padded to 64 × t: at t = 2 rank 1
// holds 36 real rows and 28 of padding, at t = 4 ranks 2 and 3 hold only padding.
TEST(TensorParallelGraph, PaddedVocabularyMatchesTheUnpaddedOneDevice) {
  for (const std::string type : {"gpt", "bert"}) {
    for (const Vocabulary vocabulary : {Vocabulary{509, 128}, Vocabulary{100, 64}}) {
      expect_tensor_parallel_matches(type, 2, false, vocabulary);
      expect_tensor_parallel_matches(type, 4, false, vocabulary);
    }
  }
}

TEST(SequenceParallelGraph, PaddedVocabularyMatchesTheUnpaddedOneDevice) {
  for (const std::string type : {"gpt", "bert"}) {
    expect_tensor_parallel_matches(type, 2, true, {509, 128});
    expect_tensor_parallel_matches(type, 4, true, {100, 64});
  }
}

TEST(SequenceParallelGraph, BertMatchesOneDevice) {
  expect_tensor_parallel_matches("bert", 2, true);
  expect_tensor_parallel_matches("bert", 4, true);
}

TEST(SequenceParallelGraph, GptMatchesOneDevice) {
  expect_tensor_parallel_matches("gpt", 2, true);
  expect_tensor_parallel_matches("gpt", 4, true);
}

}  // namespace
}  // namespace partrain
