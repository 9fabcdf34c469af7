// Autodiff: gradients of a graph in which values feed several tasks, checked against finite
// differences of the forward pass; stage-wise backward (two convex subgraphs chained through their
// boundary) equals whole-graph backward; parameter gradients accumulate over calls.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/autodiff.h"
#include "kernels/cpu/cpu_backend.h"
#include "graph/interpreter.h"
#include "support/gradient_check.h"

namespace partrain {
namespace {

// h = x * w;  a = tanh(h);  b = h * a;  c = a + b;  out = c * h * v    (h is read 3 times, a twice)
struct SharedValueGraph {
  Graph graph;
  int x, w, v, h, a, b, c, d, out;
  SharedValueGraph() {
    x = graph.add_input("x", {kBatch, 5});
    w = graph.add_parameter("w", {5});
    v = graph.add_parameter("v", {5});
    h = graph.add(OpType::Mul, "h", {x, w});
    a = graph.add(OpType::Tanh, "a", {h});
    b = graph.add(OpType::Mul, "b", {h, a});
    c = graph.add(OpType::Add, "c", {a, b});
    d = graph.add(OpType::Mul, "d", {c, h});
    out = graph.add(OpType::Mul, "out", {d, v});
    graph.mark_output(out);
  }
};

// L = sum(projection * out) for the given parameter values.
double loss(const SharedValueGraph& model, const TensorMap& feeds, const Tensor& projection) {
  TensorMap values = feeds;
  run_forward(model.graph, whole_graph(model.graph), values, cpu_backend());
  double total = 0;
  const float* y = values.at(model.out).data<float>();
  for (std::int64_t i = 0; i < projection.numel(); ++i) total += double(y[i]) * projection.data<float>()[i];
  return total;
}

TEST(Autodiff, SharedValuesMatchFiniteDifferences) {
  SharedValueGraph model;
  TensorMap feeds = {{model.x, testing::normal_tensor({3, 5}, 1)},
                     {model.w, testing::normal_tensor({5}, 2)},
                     {model.v, testing::normal_tensor({5}, 3)}};
  const Tensor projection = testing::normal_tensor({3, 5}, 4);

  const Subgraph all = whole_graph(model.graph);
  const BackwardProgram program = build_backward(model.graph, all);
  EXPECT_EQ(program.steps.size(), 6u);
  EXPECT_EQ(program.parameter_grads, (std::vector<int>{model.w, model.v}));
  EXPECT_TRUE(program.input_grads.empty());  // graph inputs get no gradient

  TensorMap values = feeds;
  run_forward(model.graph, all, values, cpu_backend());
  TensorMap grads = {{model.out, projection}};
  run_backward(model.graph, program, values, grads, cpu_backend());
  ASSERT_TRUE(grads.count(model.w) && grads.count(model.v));
  EXPECT_EQ(grads.count(model.h), 0u);  // intermediate gradients are freed

  for (int parameter : {model.w, model.v}) {
    for (int i = 0; i < 5; ++i) {
      TensorMap plus = feeds, minus = feeds;
      plus[parameter] = feeds.at(parameter).clone();
      minus[parameter] = feeds.at(parameter).clone();
      const double step = 1e-2;
      plus[parameter].data<float>()[i] += step;
      minus[parameter].data<float>()[i] -= step;
      const double numeric = (loss(model, plus, projection) - loss(model, minus, projection)) / (2 * step);
      EXPECT_NEAR(grads.at(parameter).data<float>()[i], numeric, 2e-3 * std::max(1.0, std::abs(numeric)))
          << model.graph.value(parameter).name << "[" << i << "]";
    }
  }
}

TEST(Autodiff, StageWiseBackwardEqualsWholeGraph) {
  SharedValueGraph model;
  TensorMap feeds = {{model.x, testing::normal_tensor({2, 5}, 5)},
                     {model.w, testing::normal_tensor({5}, 6)},
                     {model.v, testing::normal_tensor({5}, 7)}};
  const Tensor projection = testing::normal_tensor({2, 5}, 8);
  auto task = [&](int value) { return model.graph.value(value).producer; };

  TensorMap values = feeds;
  TensorMap whole = {{model.out, projection}};
  run_forward(model.graph, whole_graph(model.graph), values, cpu_backend());
  run_backward(model.graph, build_backward(model.graph, whole_graph(model.graph)), values, whole, cpu_backend());

  // Stage 1: h, a. Stage 2: b, c, d, out — h and a cross the boundary.
  const Subgraph first = extract_subgraph(model.graph, std::vector<int>{task(model.h), task(model.a)});
  const Subgraph second = extract_subgraph(model.graph, std::vector<int>{task(model.b), task(model.c), task(model.d), task(model.out)});
  EXPECT_EQ(first.outputs, (std::vector<int>{model.h, model.a}));
  const BackwardProgram second_backward = build_backward(model.graph, second);
  EXPECT_EQ(second_backward.input_grads, (std::vector<int>{model.h, model.a}));
  TensorMap stage_values = feeds;
  run_forward(model.graph, first, stage_values, cpu_backend());
  run_forward(model.graph, second, stage_values, cpu_backend());
  TensorMap second_grads = {{model.out, projection}};
  run_backward(model.graph, second_backward, stage_values, second_grads, cpu_backend());
  TensorMap first_grads = {{model.h, second_grads.at(model.h)}, {model.a, second_grads.at(model.a)}};
  run_backward(model.graph, build_backward(model.graph, first), stage_values, first_grads, cpu_backend());

  EXPECT_EQ(second_grads.at(model.v).to_float_vector(), whole.at(model.v).to_float_vector());
  const auto stage_w = first_grads.at(model.w).to_float_vector();
  const auto whole_w = whole.at(model.w).to_float_vector();
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(stage_w[i], whole_w[i], 1e-5 * std::max(1.f, std::abs(whole_w[i])));
}

TEST(Autodiff, ParameterGradientsAccumulateOverMicrobatches) {
  SharedValueGraph model;
  const Tensor x = testing::normal_tensor({4, 5}, 9);
  TensorMap parameters = {{model.w, testing::normal_tensor({5}, 10)}, {model.v, testing::normal_tensor({5}, 11)}};
  const Tensor projection = testing::normal_tensor({4, 5}, 12);
  const Subgraph all = whole_graph(model.graph);
  const BackwardProgram program = build_backward(model.graph, all);

  auto gradients = [&](const Tensor& input, const Tensor& seed, TensorMap& into) {
    TensorMap values = parameters;
    values[model.x] = input;
    run_forward(model.graph, all, values, cpu_backend());
    into[model.out] = seed;
    run_backward(model.graph, program, values, into, cpu_backend());
  };
  TensorMap full, halves;
  gradients(x, projection, full);
  gradients(x.slice_rows(0, 2).clone(), projection.slice_rows(0, 2).clone(), halves);
  gradients(x.slice_rows(2, 4).clone(), projection.slice_rows(2, 4).clone(), halves);
  const auto a = full.at(model.w).to_float_vector(), b = halves.at(model.w).to_float_vector();
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::max(1.f, std::abs(a[i])));
}

TEST(Autodiff, NoGradientForNonDifferentiableOrUnreachedValues) {
  Graph graph;
  const int x = graph.add_input("x", {kBatch, 3});
  const int w = graph.add_parameter("w", {3});
  const int unused = graph.add_parameter("unused", {3});
  const int y = graph.add(OpType::Mul, "y", {x, w});
  graph.add(OpType::Mul, "dead_end", {x, unused});  // not an output: receives no gradient
  graph.mark_output(y);
  const BackwardProgram program = build_backward(graph, whole_graph(graph));
  EXPECT_EQ(program.parameter_grads, (std::vector<int>{w}));
  EXPECT_EQ(program.steps.size(), 1u);
}

}  // namespace
}  // namespace partrain
