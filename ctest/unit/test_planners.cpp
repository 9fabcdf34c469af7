// Unit tests of the layer-level planners: Merak's graph sharding and planner, and the uniform and
// manual planners (CAPSlog's are in test_capslog.cpp). References are independent: brute force over all
// contiguous splits, hand-worked examples, and task sets derived from layer names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "graph/graph.h"
#include "graph/layer_names.h"
#include "graph/subgraph.h"
#include "models/model.h"
#include "partition/baselines/manual.h"
#include "partition/baselines/uniform.h"
#include "partition/common/cost_model.h"
#include "partition/common/plan_builder.h"
#include "partition/merak/merak_shard.h"
#include "partition/planner.h"
#include "support/errors.h"
#include "support/tiny_models.h"

namespace {

using namespace partrain;
using namespace partrain::partition;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

// Every composition of `layers` into `devices` positive parts.
void for_each_split(int layers, int devices, const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> counts;
  std::function<void(int, int)> recurse = [&](int left, int devices_left) {
    if (devices_left == 1) {
      counts.push_back(left);
      visit(counts);
      counts.pop_back();
      return;
    }
    for (int take = 1; take <= left - (devices_left - 1); ++take) {
      counts.push_back(take);
      recurse(left - take, devices_left - 1);
      counts.pop_back();
    }
  };
  recurse(layers, devices);
}

ModelConfig tiny_config(const std::string& type, int layers = 2) {
  ModelConfig config = partrain::testing::tiny_model_config(type);
  config.layers = layers;
  return config;
}

// Tasks (non-constant and constant) whose layer_of name is in `layers`.
std::vector<int> tasks_of_layers(const Graph& graph, const std::set<std::string>& layers) {
  std::vector<int> tasks;
  for (const Task& task : graph.tasks())
    if (layers.count(layer_of(task.name))) tasks.push_back(task.id);
  return tasks;
}

PlannerOptions planner_options(int world, std::int64_t batch = 8) {
  PlannerOptions options;
  options.world_size = world;
  options.global_batch = batch;
  return options;
}

using partrain::testing::error_message;

// ---------------------------------------------------------------------------------------------
// Merak sharding
// ---------------------------------------------------------------------------------------------

// Checks Merak's invariants and returns the shard of every non-constant task.
std::vector<int> check_shards(const Graph& graph, const std::vector<MerakShard>& shards, std::int64_t threshold,
                              int common_uses = 5) {
  std::vector<int> shard_of(graph.tasks().size(), -1);
  for (std::size_t s = 0; s < shards.size(); ++s) {
    EXPECT_FALSE(shards[s].tasks.empty());
    EXPECT_TRUE(is_convex(graph, shards[s].tasks)) << "shard " << s;
    EXPECT_TRUE(std::is_sorted(shards[s].tasks.begin(), shards[s].tasks.end()));
    for (int t : shards[s].tasks) {
      if (graph.task(t).constant) continue;
      EXPECT_EQ(shard_of[t], -1) << "task in two shards";
      shard_of[t] = static_cast<int>(s);
    }
    if (s + 1 < shards.size()) {
      EXPECT_GT(shards[s].counted_parameters, threshold) << "shard " << s;
      EXPECT_GE(shards[s].output_task, 0);
    } else {
      EXPECT_EQ(shards[s].output_task, -1);
    }
  }
  std::set<int> common;
  for (int t : merak_common_nodes(graph, common_uses)) common.insert(t);
  for (const Task& task : graph.tasks()) {
    if (task.constant) continue;
    EXPECT_GE(shard_of[task.id], 0) << task.name << " in no shard";
    for (int input : task.inputs) {
      const int producer = graph.value(input).producer;
      if (producer < 0 || graph.task(producer).constant) continue;
      const int from = shard_of[producer], to = shard_of[task.id];
      EXPECT_LE(from, to) << "edge into an earlier shard";
      if (from == to || common.count(producer)) continue;
      // Only the previous shard's output crosses shards.
      EXPECT_EQ(from, to - 1) << graph.task(producer).name << " -> " << task.name;
      EXPECT_EQ(shards[from].output_task, producer) << graph.task(producer).name << " -> " << task.name;
    }
  }
  return shard_of;
}

TEST(MerakShard, HandBuiltGraphs) {
  // A = x·wA | B = A·wB | C = B + A | D = relu(C), threshold 3 (each weight has 4 elements):
  // shard 0 closes after A; B closes shard 1; C reads A, the output of shard 0 ≠ the previous shard,
  // so shards 1..2 collapse and C joins B; D starts shard 2.
  {
    Graph graph;
    const int x = graph.add_input("x", {kBatch, 4});
    const int a = graph.add(OpType::Mul, "a", {x, graph.add_parameter("wa", {4})});
    const int b = graph.add(OpType::Mul, "b", {a, graph.add_parameter("wb", {4})});
    const int c = graph.add(OpType::Add, "c", {b, a});
    graph.mark_output(graph.add(OpType::Relu, "d", {c}));
    MerakShardOptions options;
    options.parameter_threshold = 3;
    const std::vector<MerakShard> shards = merak_shards(graph, options);
    ASSERT_EQ(shards.size(), 3u);
    EXPECT_EQ(shards[0].tasks, (std::vector<int>{0}));
    EXPECT_EQ(shards[1].tasks, (std::vector<int>{1, 2}));
    EXPECT_EQ(shards[2].tasks, (std::vector<int>{3}));
    EXPECT_EQ(shards[0].output_task, 0);
    EXPECT_EQ(shards[1].output_task, 2);
    EXPECT_EQ(shards[1].parameter_count, 4);
    check_shards(graph, shards, 3);
  }
  // An input produced inside an earlier shard (not its output) pulls the consumer into that shard:
  // A = x·wA | B = 2A, Bi = B·wB (closes) | G = Bi + B reads B inside shard 1 → G joins shard 1.
  {
    Graph graph;
    const int x = graph.add_input("x", {kBatch, 4});
    const int a = graph.add(OpType::Mul, "a", {x, graph.add_parameter("wa", {4})});
    const int b = graph.add(OpType::Scale, "b", {a}, {{"value", 2.0}});
    const int bi = graph.add(OpType::Mul, "bi", {b, graph.add_parameter("wb", {4})});
    const int g = graph.add(OpType::Add, "g", {bi, b});
    graph.mark_output(graph.add(OpType::Relu, "h", {g}));
    MerakShardOptions options;
    options.parameter_threshold = 3;
    const std::vector<MerakShard> shards = merak_shards(graph, options);
    ASSERT_EQ(shards.size(), 3u);
    EXPECT_EQ(shards[1].tasks, (std::vector<int>{1, 2, 3}));
    EXPECT_EQ(shards[2].tasks, (std::vector<int>{4}));
    check_shards(graph, shards, 3);
  }
  // A common node (k = relu(x), 6 uses) feeds every shard without collapsing them; with a common
  // threshold of 6 uses it is an ordinary node and everything collapses into one shard.
  {
    Graph graph;
    const int x = graph.add_input("x", {kBatch, 4});
    const int k = graph.add(OpType::Relu, "k", {x});
    int previous = x;
    for (int i = 1; i <= 6; ++i) {
      const int a = graph.add(OpType::Mul, "a" + std::to_string(i), {previous, graph.add_parameter("w" + std::to_string(i), {4})});
      previous = graph.add(OpType::Add, "s" + std::to_string(i), {a, k});
    }
    graph.mark_output(previous);
    MerakShardOptions options;
    options.parameter_threshold = 3;
    const std::vector<MerakShard> shards = merak_shards(graph, options);
    ASSERT_EQ(shards.size(), 7u);   // {k, a1}, {s1, a2}, …, {s5, a6}, {s6}
    EXPECT_EQ(shards[0].tasks, (std::vector<int>{0, 1}));
    EXPECT_EQ(shards[1].tasks, (std::vector<int>{2, 3}));
    EXPECT_EQ(shards[6].tasks, (std::vector<int>{12}));
    check_shards(graph, shards, 3);
    options.common_node_uses = 6;
    EXPECT_EQ(merak_shards(graph, options).size(), 1u);
  }
}

TEST(MerakShard, TinyTransformersCoverTheGraphConvexAndWithinThreshold) {
  for (const std::string type : {"bert", "gpt"}) {
    const Graph graph = build_model(tiny_config(type));
    for (int shard_count : {0, 2, 4, 8}) {
      MerakShardOptions options;
      options.shard_count = shard_count;
      const int count = shard_count > 0 ? shard_count : static_cast<int>(layer_groups(graph).size());
      const std::int64_t threshold = merak_parameter_threshold(graph, count);
      // The threshold: parameters without the embedding tables (read by Gather tasks) / shard count.
      std::int64_t body = 0;
      for (int p : graph.parameters())
      {
        const std::string& name = graph.value(p).name;
        const bool table = name.ends_with("_embeddings.weight") || name == "transformer.wte.weight" ||
                           name == "transformer.wpe.weight";
        if (!table) body += numel(graph.value(p).type.shape);
      }
      EXPECT_EQ(threshold, body / count) << type;
      const std::vector<MerakShard> shards = merak_shards(graph, options);
      EXPECT_GE(shards.size(), 2u) << type << " " << shard_count;
      check_shards(graph, shards, threshold);
      // Shards hold whole constant tasks' consumers and cover every task.
      std::set<int> covered;
      for (const MerakShard& shard : shards) covered.insert(shard.tasks.begin(), shard.tasks.end());
      EXPECT_EQ(covered.size(), graph.tasks().size());
    }
  }
}

TEST(MerakShard, BalancedRangesMatchBruteForce) {
  std::mt19937_64 random(21);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + trial % 9, stages = 1 + trial % std::min(n, 4);
    std::vector<double> costs(n);
    for (double& c : costs) c = cost(random);
    double best = std::numeric_limits<double>::infinity();
    for_each_split(n, stages, [&](const std::vector<int>& counts) {
      double largest = 0;
      int at = 0;
      for (int c : counts) {
        double sum = 0;
        for (int k = 0; k < c; ++k) sum += costs[at++];
        largest = std::max(largest, sum);
      }
      best = std::min(best, largest);
    });
    const auto ranges = balanced_contiguous_ranges(costs, stages);
    ASSERT_EQ(static_cast<int>(ranges.size()), stages);
    double largest = 0;
    EXPECT_EQ(ranges.front().first, 0u);
    EXPECT_EQ(ranges.back().second, static_cast<std::size_t>(n));
    for (std::size_t s = 0; s < ranges.size(); ++s) {
      EXPECT_LT(ranges[s].first, ranges[s].second);
      if (s > 0) {
        EXPECT_EQ(ranges[s].first, ranges[s - 1].second);
      }
      double sum = 0;
      for (std::size_t k = ranges[s].first; k < ranges[s].second; ++k) sum += costs[k];
      largest = std::max(largest, sum);
    }
    EXPECT_NEAR(largest, best, 1e-9);
  }
  EXPECT_THROW(balanced_contiguous_ranges({1.0, 2.0}, 3), Error);
}

// ---------------------------------------------------------------------------------------------
// Layer groups, uniform and manual planners
// ---------------------------------------------------------------------------------------------

std::vector<std::string> names(const std::vector<LayerGroup>& groups) {
  std::vector<std::string> result;
  for (const LayerGroup& group : groups) result.push_back(group.name);
  return result;
}

TEST(PipelineLayerGroups, TinyModelsInPipelineOrder) {
  // BERT with NSP: the pooler feeds the NSP half of "head", so it comes before head.
  EXPECT_EQ(names(layer_groups(build_model(tiny_config("bert")))),
            (std::vector<std::string>{"embeddings", "encoder.layer.0", "encoder.layer.1", "pooler", "head", "loss"}));
  EXPECT_EQ(names(layer_groups(build_model(tiny_config("gpt")))),
            (std::vector<std::string>{"embeddings", "h.0", "h.1", "ln_f", "head", "loss"}));
  EXPECT_TRUE(is_repeated_layer("encoder.layer.11"));
  EXPECT_TRUE(is_repeated_layer("h.0"));
  EXPECT_TRUE(is_repeated_layer("layer3.5"));
  EXPECT_FALSE(is_repeated_layer("embeddings"));
  EXPECT_FALSE(is_repeated_layer("layer3"));
  EXPECT_FALSE(is_repeated_layer("h."));
}

TEST(Uniform, RangesDealRepeatedLayersEquallyRemainderFirst) {
  std::vector<LayerGroup> groups;
  for (const char* name : {"embeddings", "h.0", "h.1", "h.2", "h.3", "h.4", "ln_f", "head"}) groups.push_back({name, {}});
  using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;
  EXPECT_EQ(uniform_stage_ranges(groups, 2), (Ranges{{0, 4}, {4, 8}}));            // 3 + 2 layers
  EXPECT_EQ(uniform_stage_ranges(groups, 3), (Ranges{{0, 3}, {3, 5}, {5, 8}}));    // 2 + 2 + 1
  EXPECT_EQ(uniform_stage_ranges(groups, 5), (Ranges{{0, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 8}}));
  EXPECT_EQ(uniform_stage_ranges(groups, 1), (Ranges{{0, 8}}));
  EXPECT_THROW(uniform_stage_ranges(groups, 6), Error);
}

TEST(Uniform, TinyModelsOnFourDevices) {
  for (const std::string type : {"bert", "gpt"}) {
    const Graph graph = build_model(tiny_config(type));
    const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
    const std::string first_layer = type == "bert" ? "encoder.layer.0" : "h.0";
    const std::vector<int> stage0 = tasks_of_layers(graph, {"embeddings", first_layer});
    std::vector<int> stage1;
    for (const Task& task : graph.tasks())
      if (!std::binary_search(stage0.begin(), stage0.end(), task.id)) stage1.push_back(task.id);
    // stages = 0: the world size (4) capped at the 2 repeated layers → 2 stages of 2 replicas.
    for (int stages : {0, 2}) {
      PlannerOptions options = planner_options(4);
      options.stages = stages;
      const Plan plan = plan_uniform(graph, *cost, options);
      ASSERT_EQ(plan.stages.size(), 2u) << type;
      EXPECT_EQ(plan.stages[0].tasks, stage0) << type;
      EXPECT_EQ(plan.stages[1].tasks, stage1) << type;
      EXPECT_EQ(plan.stages[0].replicas, 2);
      EXPECT_EQ(plan.stages[1].replicas, 2);
      EXPECT_EQ(plan.planner, "uniform");
      EXPECT_EQ(plan.pipeline_replicas, 1);
    }
    PlannerOptions options = planner_options(4);
    options.stages = 4;
    EXPECT_NE(error_message([&] { plan_uniform(graph, *cost, options); }).find("only 2 repeated layers"),
              std::string::npos);
  }
  // A 4-layer BERT on 4 devices: one layer per stage, one replica each.
  const Graph graph = build_model(tiny_config("bert", 4));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  const Plan plan = plan_uniform(graph, *cost, planner_options(4));
  ASSERT_EQ(plan.stages.size(), 4u);
  EXPECT_EQ(plan.stages[0].tasks, tasks_of_layers(graph, {"embeddings", "encoder.layer.0"}));
  EXPECT_EQ(plan.stages[1].tasks, tasks_of_layers(graph, {"encoder.layer.1"}));
  EXPECT_EQ(plan.stages[2].tasks, tasks_of_layers(graph, {"encoder.layer.2"}));
  EXPECT_EQ(plan.stages[3].tasks, tasks_of_layers(graph, {"encoder.layer.3", "pooler", "head", "loss"}));
  for (const PlanStage& stage : plan.stages) EXPECT_EQ(stage.replicas, 1);
}

TEST(Manual, BoundariesAndReplicas) {
  for (const std::string type : {"bert", "gpt"}) {
    const Graph graph = build_model(tiny_config(type));
    const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
    const std::string second = type == "bert" ? "encoder.layer.1" : "h.1";
    PlannerOptions options = planner_options(4);
    options.boundaries = {second};
    options.replicas = {1, 3};
    const Plan plan = plan_manual(graph, *cost, options);
    ASSERT_EQ(plan.stages.size(), 2u);
    const std::vector<int> stage0 = tasks_of_layers(graph, {"embeddings", type == "bert" ? "encoder.layer.0" : "h.0"});
    EXPECT_EQ(plan.stages[0].tasks, stage0);
    EXPECT_EQ(plan.stages[0].replicas, 1);
    EXPECT_EQ(plan.stages[1].replicas, 3);
    EXPECT_EQ(plan.pipeline_replicas, 1);
    EXPECT_EQ(plan.planner, "manual");
    // Default replicas (1 each): 2 devices per copy → 2 pipeline replicas on 4 devices.
    options.replicas.clear();
    const Plan copies = plan_manual(graph, *cost, options);
    EXPECT_EQ(copies.pipeline_replicas, 2);
    EXPECT_EQ(copies.stages[1].replicas, 1);
  }
  // Three stages: embeddings | layer 0 | layer 1 + pooler + head + loss, on 3 devices.
  const Graph graph = build_model(tiny_config("bert"));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  PlannerOptions options = planner_options(3, 6);
  options.boundaries = {"encoder.layer.0", "encoder.layer.1"};
  const Plan plan = plan_manual(graph, *cost, options);
  ASSERT_EQ(plan.stages.size(), 3u);
  EXPECT_EQ(plan.stages[0].tasks, tasks_of_layers(graph, {"embeddings"}));
  EXPECT_EQ(plan.stages[1].tasks, tasks_of_layers(graph, {"encoder.layer.0"}));
  EXPECT_EQ(plan.stages[2].tasks, tasks_of_layers(graph, {"encoder.layer.1", "pooler", "head", "loss"}));
}

TEST(Manual, ErrorsNameTheBoundary) {
  const Graph graph = build_model(tiny_config("bert"));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  PlannerOptions options = planner_options(4);
  options.boundaries = {"encoder.layer.9"};
  EXPECT_NE(error_message([&] { plan_manual(graph, *cost, options); })
                .find("[parallel] boundaries: 'encoder.layer.9' is not a layer of this model; layers are: embeddings, "
                      "encoder.layer.0, encoder.layer.1, pooler, head, loss"),
            std::string::npos);
  options.boundaries = {"encoder.layer.1", "encoder.layer.0"};
  const std::string order = error_message([&] { plan_manual(graph, *cost, options); });
  EXPECT_NE(order.find("'encoder.layer.0' (boundary 2) does not come after 'encoder.layer.1'"), std::string::npos) << order;
  options.boundaries = {"encoder.layer.1", "encoder.layer.1"};
  EXPECT_NE(error_message([&] { plan_manual(graph, *cost, options); }).find("does not come after"), std::string::npos);
  options.boundaries = {"embeddings"};
  EXPECT_NE(error_message([&] { plan_manual(graph, *cost, options); }).find("stage 1 would be empty"),
            std::string::npos);
  options.boundaries = {"encoder.layer.1"};
  options.replicas = {1, 1, 2};
  EXPECT_NE(error_message([&] { plan_manual(graph, *cost, options); }).find("[parallel] replicas: 3 values for 2 stages"),
            std::string::npos);
  options.replicas = {1, 2};
  EXPECT_NE(error_message([&] { plan_manual(graph, *cost, options); }).find("do not divide the world size 4"),
            std::string::npos);
  options.replicas = {};
  options.stages = 3;
  EXPECT_NE(error_message([&] { plan_manual(graph, *cost, options); }).find("[parallel] stages = 3"), std::string::npos);
}

// Megatron's interleaved schedule: the boundaries cut S·v model chunks, chunk c on stage c mod S.
TEST(Manual, InterleavedChunksOnTwoStages) {
  for (const std::string type : {"bert", "gpt"}) {
    const Graph graph = build_model(tiny_config(type));
    const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
    PlannerOptions options = planner_options(4);
    options.schedule = ScheduleKind::Interleaved;
    options.virtual_stages = 2;
    options.microbatches = 2;
    options.boundaries = type == "bert" ? std::vector<std::string>{"encoder.layer.0", "encoder.layer.1", "pooler"}
                                        : std::vector<std::string>{"h.0", "h.1", "ln_f"};
    options.replicas = {2, 2};
    const Plan plan = plan_manual(graph, *cost, options);
    ASSERT_EQ(plan.stages.size(), 4u) << type;
    EXPECT_EQ(plan.virtual_stages, 2);
    EXPECT_EQ(plan.pipeline_stages(), 2);
    EXPECT_EQ(plan.world_size, 4);
    EXPECT_EQ(plan.pipeline_replicas, 1);
    EXPECT_EQ(plan.stages[0].tasks, tasks_of_layers(graph, {"embeddings"}));
    for (const PlanStage& stage : plan.stages) EXPECT_EQ(stage.replicas, 2);
    EXPECT_GT(plan.predicted_step_seconds, 0);
    // Errors name the key: boundaries for 3 chunks, microbatches not a multiple of S.
    PlannerOptions odd = options;
    odd.boundaries.pop_back();
    EXPECT_NE(error_message([&] { plan_manual(graph, *cost, odd); }).find("stages x virtual_stages - 1 boundaries"),
              std::string::npos);
    odd = options;
    odd.microbatches = 1;
    EXPECT_NE(error_message([&] { plan_manual(graph, *cost, odd); }).find("[train] microbatches = 1 is not a multiple"),
              std::string::npos);
  }
}

TEST(Uniform, InterleavedChunksOfEqualLayers) {
  // A 4-layer GPT on 2 devices with v = 2: 4 chunks of one layer, chunks 0, 2 on rank 0.
  const Graph graph = build_model(tiny_config("gpt", 4));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  PlannerOptions options = planner_options(2);
  options.schedule = ScheduleKind::Interleaved;
  options.virtual_stages = 2;
  const Plan plan = plan_uniform(graph, *cost, options);
  ASSERT_EQ(plan.stages.size(), 4u);
  EXPECT_EQ(plan.pipeline_stages(), 2);
  EXPECT_EQ(plan.microbatches % 2, 0);
  EXPECT_EQ(plan.stages[1].tasks, tasks_of_layers(graph, {"h.1"}));
  EXPECT_EQ(plan.stages[2].tasks, tasks_of_layers(graph, {"h.2"}));
  // rannc plans one chunk per stage: it refuses v > 1 with the reason.
  options.planner = "rannc";
  EXPECT_NE(error_message([&] { make_plan(graph, *cost, options); }).find("one model chunk per pipeline stage"),
            std::string::npos);
}

// virtual_stages = "auto": the uniform planner plans every v and keeps the one predicted fastest,
// the same plan as asking for that v (v = 1: plain 1F1B).
TEST(Uniform, ChoosesVirtualStagesByPredictedStepTime) {
  const Graph graph = build_model(tiny_config("gpt", 8));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  PlannerOptions options = planner_options(4, 16);
  options.schedule = ScheduleKind::Interleaved;
  options.virtual_stages = 0;
  const Plan chosen = plan_uniform(graph, *cost, options);
  EXPECT_EQ(chosen.pipeline_stages(), 4);
  double fastest = std::numeric_limits<double>::infinity();
  int fastest_v = 0;
  for (int v = 1; v <= 2; ++v) {  // 8 layers on 4 stages: at most 2 chunks of one layer per rank
    PlannerOptions fixed = options;
    fixed.virtual_stages = v;
    fixed.schedule = v == 1 ? ScheduleKind::OneForwardOneBackward : ScheduleKind::Interleaved;
    const Plan plan = plan_uniform(graph, *cost, fixed);
    if (plan.predicted_step_seconds < fastest) {
      fastest = plan.predicted_step_seconds;
      fastest_v = v;
    }
  }
  EXPECT_EQ(chosen.virtual_stages, fastest_v);
  EXPECT_EQ(chosen.schedule, fastest_v == 1 ? ScheduleKind::OneForwardOneBackward : ScheduleKind::Interleaved);
  EXPECT_DOUBLE_EQ(chosen.predicted_step_seconds, fastest);
  // Only the uniform and rannc planners choose v.
  options.planner = "manual";
  EXPECT_NE(error_message([&] { make_plan(graph, *cost, options); }).find("only the uniform and rannc planners choose"),
            std::string::npos);
}

// rannc with virtual_stages = "auto" (interleaving.h) on a transformer that must be pipelined (the
// device holds about a third of its model state): the plan is plain 1F1B or interleaved, whichever
// the simulator predicts faster, and never slower than rannc's plain plan; its chunks cover the
// graph (make_plan validates), those of a rank share its replicas.
TEST(Rannc, ChoosesVirtualStagesByPredictedStepTime) {
  ModelConfig config = tiny_config("gpt", 16);
  config.vocab = 256;  // the layers, not the embedding, hold the parameters
  const Graph graph = build_model(config);
  DeviceSpec device;
  {
    std::vector<int> all(graph.tasks().size());
    for (std::size_t t = 0; t < all.size(); ++t) all[t] = static_cast<int>(t);
    const std::unique_ptr<CostModel> probe = make_analytic_cost_model(graph, device);
    device.memory_bytes = 4.0 * probe->measure(all, 1).parameter_bytes / 2.5;  // AdamW: 4 × parameters of state
  }
  device.link_bandwidth = 1e12;
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, device);
  PlannerOptions options = planner_options(4, 8);
  options.memory_margin = 0;
  const Plan plain = make_plan(graph, *cost, options);
  ASSERT_GE(plain.pipeline_stages(), 3);
  options.schedule = ScheduleKind::Interleaved;
  options.virtual_stages = 0;
  const Plan chosen = make_plan(graph, *cost, options);
  EXPECT_EQ(chosen.planner, "rannc");
  EXPECT_LE(chosen.predicted_step_seconds, plain.predicted_step_seconds);
  ASSERT_GE(chosen.virtual_stages, 2) << "expected interleaving to pay off on a 4-deep pipeline with a fast link";
  EXPECT_EQ(chosen.schedule, ScheduleKind::Interleaved);
  EXPECT_LT(chosen.predicted_step_seconds, plain.predicted_step_seconds);
  for (int c = 0; c < static_cast<int>(chosen.stages.size()); ++c)
    EXPECT_EQ(chosen.stages[c].replicas, chosen.stages[chosen.stage_of_chunk(c)].replicas);
  std::printf("rannc plain %d stages %.6f s; interleaved %d stages x v = %d, M = %d: %.6f s\n", plain.pipeline_stages(),
              plain.predicted_step_seconds, chosen.pipeline_stages(), chosen.virtual_stages, chosen.microbatches,
              chosen.predicted_step_seconds);
}

// ---------------------------------------------------------------------------------------------
// Merak planner
// ---------------------------------------------------------------------------------------------

TEST(MerakPlanner, TinyModels) {
  for (const std::string type : {"bert", "gpt"}) {
    const Graph graph = build_model(tiny_config(type, 4));
    const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
    PlannerOptions options = planner_options(4, 8);
    options.schedule = ScheduleKind::ShiftedCriticalPath;
    const Plan plan = plan_merak(graph, *cost, options);   // validated by plan_from_stages
    EXPECT_EQ(plan.planner, "merak");
    EXPECT_EQ(plan.schedule, ScheduleKind::ShiftedCriticalPath);
    // The stage count is the one whose plan predicts the shortest step, each count planned alone.
    for (int stages : {1, 2, 4}) {
      PlannerOptions fixed = options;
      fixed.stages = stages;
      EXPECT_LE(plan.predicted_step_seconds, plan_merak(graph, *cost, fixed).predicted_step_seconds * (1 + 1e-12))
          << type << " vs " << stages << " stages";
    }
    // Each shard lies in one stage.
    std::vector<int> stage_of(graph.tasks().size(), -1);
    for (std::size_t s = 0; s < plan.stages.size(); ++s)
      for (int t : plan.stages[s].tasks)
        if (!graph.task(t).constant) stage_of[t] = static_cast<int>(s);
    for (const MerakShard& shard : merak_shards(graph)) {
      std::set<int> stages_of_shard;
      for (int t : shard.tasks)
        if (!graph.task(t).constant) stages_of_shard.insert(stage_of[t]);
      EXPECT_EQ(stages_of_shard.size(), 1u);
    }
    options.stages = 2;
    EXPECT_EQ(plan_merak(graph, *cost, options).stages.size(), 2u);
    options.stages = 1000;
    EXPECT_THROW(plan_merak(graph, *cost, options), Error);
  }
}

// Left to the planner, Merak's activation policy is its stage-aware recomputation (§6.2): with room
// for every activation nothing is recomputed (the plan of recompute = "none"); with too little for
// that, the stages recompute only what does not fit, and the step is no slower than recomputing
// every stage from its boundaries.
TEST(MerakPlanner, ChoosesStageAwareRecomputation) {
  const Graph graph = build_model(tiny_config("gpt", 4));
  DeviceSpec device;
  PlannerOptions options = planner_options(4, 16);
  options.stages = 2;
  options.microbatches = 8;
  options.memory_margin = 0;
  const std::unique_ptr<CostModel> ample = make_analytic_cost_model(graph, device);
  PlannerOptions none = options;
  none.recompute = "none";
  const Plan keeping = plan_merak(graph, *ample, none);
  const Plan automatic = plan_merak(graph, *ample, options);  // recompute "auto"
  for (const PlanStage& stage : automatic.stages) EXPECT_EQ(stage.recompute, RecomputePolicy::None);
  EXPECT_NEAR(automatic.predicted_step_seconds, keeping.predicted_step_seconds, 1e-12);

  double largest = 0;
  for (const PlanStage& stage : keeping.stages) largest = std::max(largest, stage.memory_bytes);
  device.memory_bytes = 0.97 * largest;  // "none" no longer fits
  const std::unique_ptr<CostModel> tight = make_analytic_cost_model(graph, device);
  EXPECT_THROW(plan_merak(graph, *tight, none), Error);
  const Plan stage_aware = plan_merak(graph, *tight, options);
  int recomputing = 0;
  for (const PlanStage& stage : stage_aware.stages) {
    EXPECT_LE(stage.memory_bytes, device.memory_bytes);
    recomputing += stage.recompute != RecomputePolicy::None;
  }
  EXPECT_GE(recomputing, 1);
  PlannerOptions boundaries = options;
  boundaries.recompute = "boundaries";
  EXPECT_LE(stage_aware.predicted_step_seconds, plan_merak(graph, *tight, boundaries).predicted_step_seconds * (1 + 1e-12));
}

// Under schedule = "auto", the merak planner also plans under its shifted critical path schedule
// (§6.1) and keeps the fastest plan: never slower than the scp plan alone.
TEST(MerakPlanner, ScheduleAutoIncludesShiftedCriticalPath) {
  const Graph graph = build_model(tiny_config("bert", 4));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  PlannerOptions options = planner_options(4, 16);
  options.planner = "merak";
  options.stages = 4;
  options.microbatches = 8;
  options.choose_schedule = true;
  const Plan chosen = make_plan(graph, *cost, options);
  EXPECT_EQ(chosen.planner, "merak");
  for (const ScheduleKind schedule : {ScheduleKind::OneForwardOneBackward, ScheduleKind::ShiftedCriticalPath}) {
    PlannerOptions fixed = options;
    fixed.choose_schedule = false;
    fixed.schedule = schedule;
    EXPECT_LE(chosen.predicted_step_seconds, make_plan(graph, *cost, fixed).predicted_step_seconds * (1 + 1e-12))
        << schedule_name(schedule);
  }
}

}  // namespace
