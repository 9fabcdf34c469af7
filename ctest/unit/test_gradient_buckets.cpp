// Gradient buckets of the data-parallel all-reduce (runtime/gradient_buckets.h): the greedy size
// limit, and the completion order computed from a backward program against the order in which a
// real backward pass of a tiny GPT hands its gradients over (the hook the executor's buckets use).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/interpreter.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"
#include "runtime/gradient_buckets.h"
#include "support/gradient_check.h"
#include "support/tiny_models.h"

namespace partrain::runtime {
namespace {

using Buckets = std::vector<std::vector<std::size_t>>;

TEST(GradientBuckets, GreedyUpToTheLimitAndOversizedGradientsAlone) {
  const std::vector<std::int64_t> bytes = {4, 4, 4, 12, 4, 40, 4, 2, 4};
  EXPECT_EQ(assign_buckets(bytes, 10), (Buckets{{0, 1}, {2}, {3}, {4}, {5}, {6, 7, 8}}));
  EXPECT_EQ(assign_buckets(bytes, 1e9), (Buckets{{0, 1, 2, 3, 4, 5, 6, 7, 8}}));
  EXPECT_EQ(assign_buckets(bytes, 1), (Buckets{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}}));
  EXPECT_TRUE(assign_buckets(std::vector<std::int64_t>{}, 10).empty());
  EXPECT_THROW(assign_buckets(bytes, 0), Error);
  EXPECT_THROW(assign_buckets(std::vector<std::int64_t>{4, -1}, 10), Error);
}

TEST(GradientBuckets, EveryBucketWithinTheLimitUnlessOneGradientAloneExceedsIt) {
  std::vector<std::int64_t> bytes;
  for (int i = 0; i < 200; ++i) bytes.push_back((i * 7919) % 97 * (i % 5 == 0 ? 10 : 1));
  for (double limit : {50.0, 100.0, 333.0, 1000.0}) {
    const Buckets buckets = assign_buckets(bytes, limit);
    std::size_t next = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      double total = 0;
      for (std::size_t i : buckets[b]) {
        EXPECT_EQ(i, next++) << "the order is kept";
        total += static_cast<double>(bytes[i]);
      }
      ASSERT_FALSE(buckets[b].empty());
      if (buckets[b].size() > 1) {
        EXPECT_LE(total, limit) << "bucket " << b;
      }
      if (b + 1 < buckets.size()) {  // greedy: the next gradient did not fit
        EXPECT_GT(total + static_cast<double>(bytes[buckets[b + 1].front()]), limit) << "bucket " << b;
      }
    }
    EXPECT_EQ(next, bytes.size());
  }
}

// A tiny GPT's whole-graph forward and backward, recording the order of gradient hand-overs.
struct TinyGpt {
  ModelConfig config = testing::small_transformer_config("gpt");
  Graph graph = build_model(config);
  BackwardProgram program = build_backward(graph, whole_graph(graph));
  std::vector<int> parameters = graph.parameters();

  std::vector<int> handed_over() const {
    TensorMap values = initialize_parameters(graph, 7);
    std::uint64_t seed = 11;
    for (const Value& value : graph.values())
      if (value.kind == ValueKind::Input || value.kind == ValueKind::Label)
        values[value.id] = testing::index_tensor(with_batch(value.type.shape, 2), config.vocab, seed++, value.type.dtype);
    run_forward(graph, whole_graph(graph), values, cpu_backend());
    TensorMap grads;
    const int loss = graph.outputs().at(0);
    grads[loss] = Tensor::full(values.at(loss).shape(), 1.0, DType::F32);
    std::vector<int> order;
    ExecutionOptions options;
    options.on_parameter_gradient = [&](int parameter) {
      EXPECT_TRUE(grads.count(parameter)) << "handed over before it is in the caller's map";
      order.push_back(parameter);
    };
    run_backward(graph, program, values, grads, cpu_backend(), options);
    return order;
  }
};

TEST(GradientBuckets, CompletionOrderIsTheOrderOfTheBackwardPassHandOvers) {
  const TinyGpt gpt;
  std::vector<int> shuffled = gpt.parameters;  // the order of the list given does not matter
  std::reverse(shuffled.begin(), shuffled.end());
  const std::vector<GradientCompletion> order = gradient_completion_order(gpt.graph, gpt.program, shuffled);
  ASSERT_EQ(order.size(), gpt.parameters.size());
  std::vector<int> computed;
  for (const GradientCompletion& completion : order) {
    ASSERT_GE(completion.last_step, 0) << gpt.graph.value(completion.parameter).name << " gets a gradient";
    computed.push_back(completion.parameter);
  }
  EXPECT_EQ(computed, gpt.handed_over());
  std::vector<int> duplicate = {gpt.parameters[0], gpt.parameters[0]};
  EXPECT_THROW(gradient_completion_order(gpt.graph, gpt.program, duplicate), Error);
}

TEST(GradientBuckets, CompletionOrderIsTheReverseOfTheForwardOrder) {
  const TinyGpt gpt;
  const std::vector<GradientCompletion> order = gradient_completion_order(gpt.graph, gpt.program, gpt.parameters);
  auto first_index = [&](const std::string& prefix) {
    for (std::size_t i = 0; i < order.size(); ++i)
      if (gpt.graph.value(order[i].parameter).name.starts_with(prefix)) return static_cast<std::ptrdiff_t>(i);
    return std::ptrdiff_t{-1};
  };
  auto last_index = [&](const std::string& prefix) {
    std::ptrdiff_t last = -1;
    for (std::size_t i = 0; i < order.size(); ++i)
      if (gpt.graph.value(order[i].parameter).name.starts_with(prefix)) last = static_cast<std::ptrdiff_t>(i);
    return last;
  };
  // ln_f (used last in the forward pass) completes first, every h.1 gradient before every h.0 one,
  // and the embeddings (used first; wte also by the tied LM head) last (Hugging Face names).
  ASSERT_GE(first_index("transformer.ln_f"), 0);
  EXPECT_LT(last_index("transformer.ln_f"), first_index("transformer.h.1."));
  EXPECT_LT(last_index("transformer.h.1."), first_index("transformer.h.0."));
  EXPECT_LT(last_index("transformer.h.0."), first_index("transformer.wpe"));
  EXPECT_EQ(static_cast<std::size_t>(std::max(last_index("transformer.wte"), last_index("transformer.wpe"))), order.size() - 1);
}

}  // namespace
}  // namespace partrain::runtime
