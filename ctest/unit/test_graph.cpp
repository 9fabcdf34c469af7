// Graph IR: shape inference with a symbolic batch, constant tasks, topological order, convexity,
// subgraph extraction with boundary values, standalone graphs, stable hashing, task costs, layer
// names.
#include <gtest/gtest.h>

#include "graph/layer_names.h"
#include "graph/subgraph.h"

namespace partrain {
namespace {

// A diamond with a constant branch:
//   x[B,4] --a=Scale--> a --b=Relu--> b --d=Add(b,c)--> d --e=Mul(d,w2)--> e
//                    \--c=Tanh------> c --^
//   w[4] --p=Scale--> p (constant) --q=Mul(a, p)--> q (non-constant)
struct Diamond {
  Graph graph;
  int x, w, w2, a, b, c, d, e, p, q;
  Diamond() {
    x = graph.add_input("x", {kBatch, 4});
    w = graph.add_parameter("w", {4});
    w2 = graph.add_parameter("w2", {4});
    a = graph.add(OpType::Scale, "a", {x}, {{"value", 2.0}});
    b = graph.add(OpType::Relu, "b", {a});
    c = graph.add(OpType::Tanh, "c", {a});
    d = graph.add(OpType::Add, "d", {b, c});
    e = graph.add(OpType::Mul, "e", {d, w2});
    p = graph.add(OpType::Scale, "p", {w}, {{"value", 0.5}});
    q = graph.add(OpType::Mul, "q", {a, p});
    graph.mark_output(e);
    graph.mark_output(q);
  }
  int task(int value) const { return graph.value(value).producer; }
};

TEST(Graph, InfersSymbolicShapesAndNamesTheTaskOnErrors) {
  Diamond diamond;
  EXPECT_EQ(diamond.graph.value(diamond.e).type.shape, (Shape{kBatch, 4}));
  EXPECT_EQ(diamond.graph.value(diamond.p).type.shape, (Shape{4}));
  const int wrong = diamond.graph.add_parameter("wrong", {3});
  try {
    diamond.graph.add(OpType::Add, "bad_add", {diamond.a, wrong});
    FAIL() << "no exception";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("bad_add"), std::string::npos) << error.what();
  }
  EXPECT_THROW(diamond.graph.add(OpType::Relu, "a", {diamond.x}), Error);  // duplicate name
  EXPECT_THROW(diamond.graph.add(OpType::Relu, "r", {999}), Error);        // unknown input
}

TEST(Graph, MarksConstantTasks) {
  Diamond diamond;
  EXPECT_TRUE(diamond.graph.task(diamond.task(diamond.p)).constant);   // depends only on a parameter
  for (int v : {diamond.a, diamond.b, diamond.c, diamond.d, diamond.e, diamond.q})
    EXPECT_FALSE(diamond.graph.task(diamond.task(v)).constant) << diamond.graph.value(v).name;
}

TEST(Graph, TopologicalOrderOfAnySubset) {
  Diamond diamond;
  const std::vector<int> subset = {diamond.task(diamond.e), diamond.task(diamond.b), diamond.task(diamond.d),
                                   diamond.task(diamond.c)};
  const std::vector<int> order = diamond.graph.topological_order(subset);
  auto position = [&](int value) { return std::find(order.begin(), order.end(), diamond.task(value)) - order.begin(); };
  EXPECT_EQ(order.size(), 4u);
  EXPECT_LT(position(diamond.b), position(diamond.d));
  EXPECT_LT(position(diamond.c), position(diamond.d));
  EXPECT_LT(position(diamond.d), position(diamond.e));
}

TEST(Graph, ConvexityChecks) {
  Diamond diamond;
  auto t = [&](int value) { return diamond.task(value); };
  EXPECT_TRUE(is_convex(diamond.graph, std::vector<int>{t(diamond.a), t(diamond.b), t(diamond.c), t(diamond.d)}));
  EXPECT_TRUE(is_convex(diamond.graph, std::vector<int>{t(diamond.b), t(diamond.c)}));
  // a -> b -> d with c outside: the path a -> c -> d leaves and re-enters the set.
  EXPECT_FALSE(is_convex(diamond.graph, std::vector<int>{t(diamond.a), t(diamond.b), t(diamond.d)}));
  EXPECT_FALSE(is_convex(diamond.graph, std::vector<int>{t(diamond.a), t(diamond.e)}));
  EXPECT_THROW(extract_subgraph(diamond.graph, std::vector<int>{t(diamond.a), t(diamond.d)}), Error);
}

TEST(Graph, ConvexityScalesToLongChains) {
  // 20,000 tasks in a chain with skip connections every other task: a prefix is convex, a set with a
  // hole is not, and both answers come quickly.
  Graph graph;
  int previous = graph.add_input("x", {kBatch, 2});
  int skip = previous;
  std::vector<int> tasks;
  for (int i = 0; i < 20000; ++i) {
    const int next = (i % 2) ? graph.add(OpType::Add, "task_" + std::to_string(i), {previous, skip})
                             : graph.add(OpType::Relu, "task_" + std::to_string(i), {previous});
    if (i % 2) skip = next;
    previous = next;
    tasks.push_back(graph.value(next).producer);
  }
  const std::vector<int> prefix(tasks.begin(), tasks.begin() + 15000);
  EXPECT_TRUE(is_convex(graph, prefix));
  std::vector<int> holed = prefix;
  holed.erase(holed.begin() + 7000);
  EXPECT_FALSE(is_convex(graph, holed));
}

TEST(Graph, ExtractsSubgraphWithBoundaryValues) {
  Diamond diamond;
  auto t = [&](int value) { return diamond.task(value); };
  const Subgraph stage = extract_subgraph(diamond.graph, std::vector<int>{t(diamond.e), t(diamond.d), t(diamond.c), t(diamond.b)});
  EXPECT_EQ(stage.tasks, (std::vector<int>{t(diamond.b), t(diamond.c), t(diamond.d), t(diamond.e)}));
  EXPECT_EQ(stage.inputs, (std::vector<int>{diamond.w2, diamond.a}));   // ascending value ids
  EXPECT_EQ(stage.outputs, (std::vector<int>{diamond.e}));
  EXPECT_EQ(stage.parameters(diamond.graph), (std::vector<int>{diamond.w2}));
  EXPECT_EQ(stage.boundary_activations(diamond.graph), (std::vector<int>{diamond.a}));

  const Subgraph first = extract_subgraph(diamond.graph, std::vector<int>{t(diamond.a)});
  EXPECT_EQ(first.inputs, (std::vector<int>{diamond.x}));
  EXPECT_EQ(first.outputs, (std::vector<int>{diamond.a}));

  const Graph trimmed = standalone_graph(diamond.graph, stage);
  EXPECT_EQ(trimmed.tasks().size(), 4u);
  EXPECT_EQ(trimmed.value(trimmed.value_id("a")).kind, ValueKind::Input);
  EXPECT_EQ(trimmed.value(trimmed.value_id("a")).type.shape, (Shape{kBatch, 4}));
  EXPECT_EQ(trimmed.value(trimmed.value_id("w2")).kind, ValueKind::Param);
  EXPECT_EQ(trimmed.outputs().size(), 1u);
  EXPECT_EQ(trimmed.value(trimmed.outputs()[0]).name, "e");
}

TEST(Graph, HashIsStableAndStructural) {
  Diamond one, two;
  EXPECT_EQ(one.graph.hash(), two.graph.hash());
  two.graph.add(OpType::Scale, "extra", {two.e}, {{"value", 3.0}});
  EXPECT_NE(one.graph.hash(), two.graph.hash());
  Diamond three;
  three.graph.add(OpType::Scale, "extra", {three.e}, {{"value", 4.0}});  // only an attribute differs
  EXPECT_NE(two.graph.hash(), three.graph.hash());
}

TEST(Graph, TaskCosts) {
  Graph graph;
  const int x = graph.add_input("x", {kBatch, 16, 8});
  const int w = graph.add_parameter("w", {8});
  const int y = graph.add(OpType::Mul, "y", {x, w});
  const Task& task = graph.task(graph.value(y).producer);
  EXPECT_EQ(task.cost.forward_flops, 16 * 8);
  EXPECT_EQ(task.cost.activation_bytes, 16 * 8 * 4);
  EXPECT_EQ(task.cost.parameter_bytes, 8 * 4);
  EXPECT_EQ(graph.parameter_count(), 8);
}

TEST(LayerNames, LayerGroupsForSummaries) {
  EXPECT_EQ(layer_of("bert.encoder.layer.3.attention.self.query.weight"), "encoder.layer.3");
  EXPECT_EQ(layer_of("bert.embeddings.word_embeddings.weight"), "embeddings");
  EXPECT_EQ(layer_of("cls.predictions.bias"), "head");
  EXPECT_EQ(layer_of("bert.pooler.dense.weight"), "pooler");
  EXPECT_EQ(layer_of("transformer.h.11.mlp.c_fc.weight"), "h.11");
  EXPECT_EQ(layer_of("transformer.wte.weight"), "embeddings");
  EXPECT_EQ(layer_of("transformer.ln_f.weight"), "ln_f");
  EXPECT_EQ(layer_of("layer3.5.conv2.weight"), "layer3.5");
  EXPECT_EQ(layer_of("bn1.running_var"), "stem");
  EXPECT_EQ(layer_of("fc.weight"), "head");
  EXPECT_EQ(layer_index_after("transformer.h.11.ln_1.weight", "transformer.h."), 11);
  EXPECT_EQ(layer_index_after("transformer.ln_f.weight", "transformer.h."), -1);
}

}  // namespace
}  // namespace partrain
