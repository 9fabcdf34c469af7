// The backward split for the zero-bubble schedules (graph/autodiff.h split_backward; Qi et al.,
// "Zero Bubble Pipeline Parallelism", ICLR 2024, §2): the input-gradient half (B) and then the
// weight-gradient half (W) give parameter gradients bit-identical to the whole backward, on BERT,
// GPT and ResNet, also when W reads only its own saved tensors and when some steps may not wait.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "graph/autodiff.h"
#include "graph/interpreter.h"
#include "graph/saved_tensors.h"
#include "graph/subgraph.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"
#include "support/tiny_models.h"

namespace partrain {
namespace {

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct Forward {
  Graph graph;
  BackwardProgram program;
  TensorMap values;
};

Forward run_model(const std::string& type) {
  Forward run{build_model(testing::tiny_model_config(type)), {}, {}};
  const Subgraph all = whole_graph(run.graph);
  run.program = build_backward(run.graph, all);
  run.values = testing::model_feeds(run.graph, 2);
  ExecutionOptions options;
  options.random = RandomContext{99, 1, 0, 0, 0};
  run_forward(run.graph, all, run.values, cpu_backend(), options);
  return run;
}

// The loss seed and, for every parameter, an accumulator that already holds a gradient (the
// microbatches before this one), so that the hand-over's accumulation is compared too.
TensorMap seeded_gradients(const Forward& run) {
  TensorMap grads;
  for (int output : run.program.output_grads) grads[output] = Tensor::full(run.values.at(output).shape(), 0.25);
  for (int parameter : run.program.parameter_grads)
    grads[parameter] = Tensor::full(run.values.at(parameter).shape(), 0.5);
  return grads;
}

// Runs B, optionally lets go of everything W does not read, then W; returns the gradient map.
TensorMap split_gradients(const Forward& run, const SplitBackward& split, bool release) {
  TensorMap values = run.values;
  TensorMap grads = seeded_gradients(run);
  run_backward(run.graph, split.input, values, grads, cpu_backend());
  if (release) {
    const std::vector<int> saved = saved_for_backward(run.graph, split.weight);
    release_unsaved(run.graph, values, {saved.begin(), saved.end()});
  }
  run_backward(run.graph, split.weight, values, grads, cpu_backend());
  return grads;
}

void expect_bit_identical(const Forward& run, const TensorMap& whole, const TensorMap& split, const std::string& what) {
  for (int parameter : run.program.parameter_grads)
    EXPECT_TRUE(bitwise_equal(whole.at(parameter), split.at(parameter)))
        << what << ": gradient of " << run.graph.value(parameter).name;
}

class SplitBackwardModels : public ::testing::TestWithParam<std::string> {};

TEST_P(SplitBackwardModels, BThenWIsBitIdenticalToTheWholeBackward) {
  const Forward run = run_model(GetParam());
  TensorMap whole = seeded_gradients(run);
  run_backward(run.graph, run.program, run.values, whole, cpu_backend());

  const SplitBackward split = split_backward(run.graph, run.program);
  // Every parameter waits for W; B computes no parameter gradient and W no activation gradient.
  EXPECT_TRUE(split.input.parameter_grads.empty());
  EXPECT_EQ(split.weight.parameter_grads, run.program.parameter_grads);
  EXPECT_GT(split.weight.steps.size(), 0u);
  for (const BackwardStep& step : split.weight.steps) {
    const Task& task = run.graph.task(step.task);
    for (std::size_t k = 0; k < task.inputs.size(); ++k)
      if (step.input_grad_needed[k]) {
        EXPECT_EQ(run.graph.value(task.inputs[k]).kind, ValueKind::Param) << task.name;
      }
  }
  expect_bit_identical(run, whole, split_gradients(run, split, false), "B then W");
  // W reads only what its own steps declare: the rest can go right after B.
  expect_bit_identical(run, whole, split_gradients(run, split, true), "B, release, W");
  // W needs less than the whole backward: the tensors only B reads are freed after it.
  EXPECT_LT(saved_for_backward(run.graph, split.weight).size(), saved_for_backward(run.graph, run.program).size());
}

TEST_P(SplitBackwardModels, StepsThatMayNotWaitKeepTheirParametersInB) {
  const Forward run = run_model(GetParam());
  TensorMap whole = seeded_gradients(run);
  run_backward(run.graph, run.program, run.values, whole, cpu_backend());
  // Every other step computes its parameter gradients in B (as a recomputed segment's do).
  const SplitBackward split = split_backward(run.graph, run.program, [](std::size_t i) { return i % 2 == 0; });
  EXPECT_FALSE(split.input.parameter_grads.empty());
  EXPECT_FALSE(split.weight.parameter_grads.empty());
  EXPECT_EQ(split.input.parameter_grads.size() + split.weight.parameter_grads.size(), run.program.parameter_grads.size());
  expect_bit_identical(run, whole, split_gradients(run, split, true), "half the steps deferred");
  // Positions map every step to the half that runs it, in order.
  const std::vector<int> in_input = step_positions(run.program, split.input);
  const std::vector<int> in_weight = step_positions(run.program, split.weight);
  int next_input = 0, next_weight = 0;
  for (std::size_t i = 0; i < run.program.steps.size(); ++i) {
    EXPECT_TRUE(in_input[i] >= 0 || in_weight[i] >= 0) << "step " << i << " runs in neither half";
    if (in_input[i] >= 0) {
      EXPECT_EQ(in_input[i], next_input++);
    }
    if (in_weight[i] >= 0) {
      EXPECT_EQ(in_weight[i], next_weight++);
    }
  }
  EXPECT_EQ(next_input, static_cast<int>(split.input.steps.size()));
  EXPECT_EQ(next_weight, static_cast<int>(split.weight.steps.size()));
}

INSTANTIATE_TEST_SUITE_P(Models, SplitBackwardModels, ::testing::Values("bert", "gpt", "resnet"),
                         [](const auto& info) { return info.param; });

TEST(SplitBackward, AnActivationGradientIsTheSameInB) {
  // The gradients sent to the previous stage come from B alone: a stage's boundary input.
  Graph graph;
  const int input = graph.add_input("input", {kBatch, 4});
  const int x = graph.add(OpType::Tanh, "x", {input});  // the previous stage's output
  const int w = graph.add_parameter("w", {4});
  const int y = graph.add(OpType::Mul, "y", {x, w});
  const int z = graph.add(OpType::Tanh, "z", {y});
  graph.mark_output(z);
  const std::vector<int> tasks{graph.value(y).producer, graph.value(z).producer};
  const Subgraph all = extract_subgraph(graph, tasks);
  const BackwardProgram program = build_backward(graph, all);
  ASSERT_EQ(program.input_grads, std::vector<int>{x});
  TensorMap values = {{x, Tensor::full({3, 4}, 0.3)}, {w, Tensor::full({4}, -0.7)}};
  run_forward(graph, all, values, cpu_backend());
  TensorMap whole = {{z, Tensor::full({3, 4}, 1.0)}, {w, Tensor::zeros({4})}};
  run_backward(graph, program, values, whole, cpu_backend());
  const SplitBackward split = split_backward(graph, program);
  TensorMap grads = {{z, Tensor::full({3, 4}, 1.0)}, {w, Tensor::zeros({4})}};
  run_backward(graph, split.input, values, grads, cpu_backend());
  EXPECT_TRUE(bitwise_equal(whole.at(x), grads.at(x)));
  EXPECT_TRUE(bitwise_equal(grads.at(w), Tensor::zeros({4})));  // not yet: W has not run
  run_backward(graph, split.weight, values, grads, cpu_backend());
  EXPECT_TRUE(bitwise_equal(whole.at(w), grads.at(w)));
}

}  // namespace
}  // namespace partrain
