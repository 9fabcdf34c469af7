// Unit tests of RaNNC's atomic subcomponents and block partitioning (src/partition/rannc/atomic, blocks):
// a hand-built graph with known components and clones, bert-tiny properties, a brute-force optimum
// for compaction on chains, uncoarsening's communication gain, errors, and the 256-layer enlarged
// BERT of the RaNNC paper at scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "graph/subgraph.h"
#include "io/config.h"
#include "models/model.h"
#include "partition/rannc/atomic.h"
#include "partition/rannc/blocks.h"
#include "support/tiny_models.h"

namespace partrain {
namespace {

using partition::AtomicComponent;
using partition::Block;
using partition::BlockOptions;
using partition::BlockPartition;

using Ints = std::vector<std::int64_t>;

// Costs from the graph's analytic task costs: forward + backward = 3x forward FLOPs at 100 TFLOP/s
// plus a small per-task overhead; memory = activations at the batch + weights, gradients and Adam.
BlockOptions analytic_options(const Graph& graph, int blocks, std::int64_t batch = 8) {
  BlockOptions options;
  options.blocks = blocks;
  options.batch = batch;
  for (const Task& task : graph.tasks()) {
    options.task_seconds.push_back(3 * task.cost.forward_flops * static_cast<double>(batch) / 1e14 + 1e-6);
    options.task_memory_bytes.push_back(task.cost.activation_bytes * static_cast<double>(batch) +
                                        4 * task.cost.parameter_bytes);
  }
  return options;
}

// Checks every property the stage DP relies on and returns the block of each non-constant task.
std::vector<int> expect_valid_blocks(const Graph& graph, const std::vector<Block>& blocks, const BlockOptions& options) {
  const int task_count = static_cast<int>(graph.tasks().size());
  std::vector<int> block_of(task_count, -1);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const Block& block = blocks[b];
    EXPECT_FALSE(block.tasks.empty()) << "block " << b;
    EXPECT_TRUE(std::is_sorted(block.tasks.begin(), block.tasks.end())) << "block " << b;
    EXPECT_TRUE(std::adjacent_find(block.tasks.begin(), block.tasks.end()) == block.tasks.end()) << "block " << b;
    std::vector<int> non_constant;
    double seconds = 0, bytes = 0;
    std::set<int> members(block.tasks.begin(), block.tasks.end());
    for (int task : block.tasks) {
      seconds += options.task_seconds[task];
      bytes += options.task_memory_bytes[task];
      // Every constant producer a member needs is in the block too (cloned).
      for (int input : graph.task(task).inputs) {
        const int producer = graph.value(input).producer;
        if (producer >= 0 && graph.task(producer).constant) {
          EXPECT_TRUE(members.count(producer)) << "block " << b << " lacks constant task " << producer;
        }
      }
      if (graph.task(task).constant) continue;
      non_constant.push_back(task);
      EXPECT_EQ(block_of[task], -1) << "task " << task << " in two blocks";
      block_of[task] = static_cast<int>(b);
    }
    EXPECT_FALSE(non_constant.empty()) << "block " << b;
    EXPECT_TRUE(is_convex(graph, non_constant)) << "block " << b << " is not convex";
    EXPECT_NEAR(block.compute_seconds, seconds, 1e-9 * std::max(1.0, seconds)) << "block " << b;
    EXPECT_NEAR(block.memory_bytes, bytes, 1e-9 * std::max(1.0, bytes)) << "block " << b;
    EXPECT_LE(block.memory_bytes, options.memory_limit_bytes) << "block " << b;
  }
  for (const Task& task : graph.tasks()) {
    if (task.constant) continue;
    EXPECT_GE(block_of[task.id], 0) << "task " << task.name << " is in no block";
    for (int input : task.inputs) {
      const int producer = graph.value(input).producer;
      if (producer < 0 || graph.task(producer).constant) continue;
      EXPECT_LE(block_of[producer], block_of[task.id]) << "edge " << graph.task(producer).name << " -> " << task.name
                                                       << " goes backwards in the pipeline";
    }
  }
  return block_of;
}

// A chain input -> Relu -> Relu -> ... of `length` tasks (all non-constant).
Graph chain_graph(int length) {
  Graph graph;
  int x = graph.add_input("x", {kBatch, 8});
  for (int i = 0; i < length; ++i) x = graph.add(OpType::Relu, "relu" + std::to_string(i), {x});
  graph.mark_output(x);
  return graph;
}

// Smallest largest-part compute over every split of a chain into `parts` contiguous parts whose
// memory fits; infinity when none fits.
double brute_force_bottleneck(const std::vector<double>& seconds, const std::vector<double>& bytes, int parts,
                              double limit) {
  const int n = static_cast<int>(seconds.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> cuts;  // start of each part after the first
  std::function<void(int, int)> choose = [&](int next, int remaining) {
    if (remaining == 0) {
      double worst = 0;
      int begin = 0;
      for (std::size_t p = 0; p <= cuts.size(); ++p) {
        const int end = p < cuts.size() ? cuts[p] : n;
        double part_seconds = 0, part_bytes = 0;
        for (int i = begin; i < end; ++i) {
          part_seconds += seconds[i];
          part_bytes += bytes[i];
        }
        if (part_bytes > limit) return;
        worst = std::max(worst, part_seconds);
        begin = end;
      }
      best = std::min(best, worst);
      return;
    }
    for (int cut = next; cut <= n - remaining; ++cut) {
      cuts.push_back(cut);
      choose(cut + 1, remaining - 1);
      cuts.pop_back();
    }
  };
  choose(1, parts - 1);
  return best;
}

// ---------------------------------------------------------------- atomic components (§III-A)

TEST(AtomicComponents, HandBuiltGraphClonesConstantChains) {
  Graph graph;
  const int x = graph.add_input("x", {kBatch, 4});
  const int w = graph.add_parameter("w", {4, 4});
  const int b = graph.add_parameter("b", {4});
  const int w_t = graph.add(OpType::Permute, "w_t", {w}, {{"perm", Ints{1, 0}}});          // 0 constant
  const int w_r = graph.add(OpType::Reshape, "w_r", {w_t}, {{"shape", Ints{4, 4}}});       // 1 constant
  const int h = graph.add(OpType::MatMul, "h", {x, w_r});                                  // 2
  const int b_relu = graph.add(OpType::Relu, "b_relu", {b});                               // 3 constant
  const int y = graph.add(OpType::Add, "y", {h, b_relu});                                  // 4
  const int z = graph.add(OpType::MatMul, "z", {y, w_r});                                  // 5
  const int out = graph.add(OpType::Relu, "out", {z});                                     // 6
  const int w_scaled = graph.add(OpType::Scale, "w_scaled", {w}, {{"value", 2.0}});        // 7 constant, unused
  graph.mark_output(out);
  graph.mark_output(w_scaled);
  ASSERT_EQ(graph.tasks().size(), 8u);
  const std::vector<bool> constant{true, true, false, true, false, false, false, true};
  for (int t = 0; t < 8; ++t) EXPECT_EQ(graph.task(t).constant, constant[t]) << graph.task(t).name;

  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  ASSERT_EQ(components.size(), 4u);
  EXPECT_EQ(components[0].task, 2);
  EXPECT_EQ(components[0].tasks, (std::vector<int>{0, 1, 2}));  // Permute -> Reshape chain cloned ...
  EXPECT_EQ(components[1].task, 4);
  EXPECT_EQ(components[1].tasks, (std::vector<int>{3, 4}));
  EXPECT_EQ(components[2].task, 5);
  EXPECT_EQ(components[2].tasks, (std::vector<int>{0, 1, 5}));  // ... into both MatMuls
  EXPECT_EQ(components[3].task, 6);
  EXPECT_EQ(components[3].tasks, (std::vector<int>{6, 7}));     // the unused constant joins the last

  // Two blocks: whichever MatMul a block holds, it holds the cloned weight chain too.
  BlockOptions options;
  options.blocks = 2;
  options.task_seconds = {0.5, 0.5, 2, 0.25, 1, 2, 1, 0.125};
  options.task_memory_bytes = {10, 10, 100, 5, 50, 100, 50, 20};
  const BlockPartition result = partition::partition_blocks_detailed(graph, components, options);
  ASSERT_EQ(result.blocks.size(), 2u);
  expect_valid_blocks(graph, result.blocks, options);
  // The bottleneck-optimal split: (0.5+0.5+2 + 0.25+1) | (0.5+0.5+2 + 1+0.125).
  EXPECT_EQ(result.blocks[0].tasks, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(result.blocks[1].tasks, (std::vector<int>{0, 1, 5, 6, 7}));
  EXPECT_DOUBLE_EQ(result.blocks[0].compute_seconds, 4.25);
  EXPECT_DOUBLE_EQ(result.blocks[1].compute_seconds, 4.125);
  EXPECT_DOUBLE_EQ(result.blocks[0].memory_bytes, 175);
  EXPECT_DOUBLE_EQ(result.blocks[1].memory_bytes, 190);
  // Only y ([B, 4] f32 at batch 1: 16 bytes) crosses, at 10 GB/s.
  EXPECT_DOUBLE_EQ(result.communication_seconds, 16 / 1e10);
}

TEST(AtomicComponents, BertTinyHasOneComponentPerNonConstantTaskWithItsConstantAncestors) {
  const Graph graph = build_model(testing::tiny_model_config("bert"));
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  std::vector<int> heads;
  int constant_tasks = 0;
  for (const Task& task : graph.tasks()) {
    if (task.constant) ++constant_tasks;
    else heads.push_back(task.id);
  }
  ASSERT_GT(constant_tasks, 0);  // the position-embedding lookup
  ASSERT_EQ(components.size(), heads.size());
  std::vector<int> appearances(graph.tasks().size(), 0);
  for (std::size_t c = 0; c < components.size(); ++c) {
    const AtomicComponent& component = components[c];
    EXPECT_EQ(component.task, heads[c]);  // ordered by task
    // Expected constant ancestors: a breadth-first walk over constant producers.
    std::set<int> expected{component.task};
    std::vector<int> frontier{component.task};
    while (!frontier.empty()) {
      const int task = frontier.back();
      frontier.pop_back();
      for (int input : graph.task(task).inputs) {
        const int producer = graph.value(input).producer;
        if (producer >= 0 && graph.task(producer).constant && expected.insert(producer).second)
          frontier.push_back(producer);
      }
    }
    EXPECT_EQ(component.tasks, std::vector<int>(expected.begin(), expected.end())) << graph.task(component.task).name;
    for (int task : component.tasks) ++appearances[task];
  }
  for (const Task& task : graph.tasks()) {
    if (!task.constant) {
      EXPECT_EQ(appearances[task.id], 1) << task.name;
    }
  }
  const int position_lookup = graph.value(graph.value_id("bert.embeddings.position_embeddings")).producer;
  ASSERT_TRUE(graph.task(position_lookup).constant);
  EXPECT_EQ(appearances[position_lookup], 1);  // only the sum with the positions reads it
  const int sum_positions = graph.value(graph.value_id("bert.embeddings.sum_positions")).producer;
  const auto owner = std::find_if(components.begin(), components.end(),
                                  [&](const AtomicComponent& c) { return c.task == sum_positions; });
  ASSERT_NE(owner, components.end());
  EXPECT_TRUE(std::binary_search(owner->tasks.begin(), owner->tasks.end(), position_lookup));
}

TEST(AtomicComponents, EmptyGraphHasNoneAndAGraphWithoutInputsIsAnError) {
  EXPECT_TRUE(partition::atomic_components(Graph{}).empty());
  Graph constant_only;
  const int w = constant_only.add_parameter("w", {4});
  constant_only.mark_output(constant_only.add(OpType::Relu, "relu", {w}));
  EXPECT_THROW(partition::atomic_components(constant_only), Error);
}

// ---------------------------------------------------------------- blocks (§III-B)

TEST(Blocks, BertTinyBlocksAreConvexCoveringAndInPipelineOrder) {
  const Graph graph = build_model(testing::tiny_model_config("bert"));
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  for (int k : {1, 2, 3, 4, 8, 16, 32}) {
    SCOPED_TRACE("k = " + std::to_string(k));
    const BlockOptions options = analytic_options(graph, k);
    const BlockPartition result = partition::partition_blocks_detailed(graph, components, options);
    ASSERT_EQ(result.blocks.size(), static_cast<std::size_t>(k));
    expect_valid_blocks(graph, result.blocks, options);
    EXPECT_LE(result.uncoarsened_communication_seconds, result.coarsened_communication_seconds);
    EXPECT_DOUBLE_EQ(result.communication_seconds, partition::communication_seconds(graph, result.blocks, options));
    EXPECT_GT(result.coarsening_levels, 0);
    if (k == 1) {
      EXPECT_EQ(result.blocks[0].tasks.size(), graph.tasks().size());
    }
  }
}

TEST(Blocks, EveryPhaseSwitchGivesValidBlocks) {
  const Graph graph = build_model(testing::tiny_model_config("bert"));
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  for (int phases = 0; phases < 4; ++phases) {
    BlockOptions options = analytic_options(graph, 6);
    options.coarsen = phases & 1;
    options.uncoarsen = phases & 2;
    const BlockPartition result = partition::partition_blocks_detailed(graph, components, options);
    ASSERT_EQ(result.blocks.size(), 6u) << "phases " << phases;
    expect_valid_blocks(graph, result.blocks, options);
    if (!options.coarsen) {
      EXPECT_EQ(result.coarsening_levels, 0);
      EXPECT_EQ(result.coarsened_groups, components.size());
      EXPECT_EQ(result.uncoarsening_moves, 0);
    }
  }
}

TEST(Blocks, FewerComponentsThanBlocksGivesOneBlockPerComponent) {
  const Graph graph = chain_graph(5);
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  BlockOptions options;
  options.blocks = 8;
  options.task_seconds.assign(5, 1.0);
  options.task_memory_bytes.assign(5, 1.0);
  const std::vector<Block> blocks = partition::partition_blocks(graph, components, options);
  ASSERT_EQ(blocks.size(), 5u);
  for (int b = 0; b < 5; ++b) EXPECT_EQ(blocks[b].tasks, std::vector<int>{b});
}

TEST(Blocks, CompactionMatchesTheBruteForceBottleneckOnChains) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> cost(0.1, 10.0);
  for (int trial = 0; trial < 30; ++trial) {
    const int length = 6 + trial % 7;
    const int parts = 2 + trial % 4;
    const Graph graph = chain_graph(length);
    const std::vector<AtomicComponent> components = partition::atomic_components(graph);
    BlockOptions options;
    options.blocks = parts;
    options.coarsen = false;  // compaction alone on the atomic components
    options.uncoarsen = false;
    for (int i = 0; i < length; ++i) {
      options.task_seconds.push_back(cost(random));
      options.task_memory_bytes.push_back(cost(random));
    }
    // Every third trial has a memory limit that binds: about 1.3x an even share.
    double total_bytes = 0;
    for (double bytes : options.task_memory_bytes) total_bytes += bytes;
    if (trial % 3 == 0) {
      options.memory_limit_bytes = std::max(1.3 * total_bytes / parts,
                                            *std::max_element(options.task_memory_bytes.begin(),
                                                              options.task_memory_bytes.end()));
    }
    const double optimum =
        brute_force_bottleneck(options.task_seconds, options.task_memory_bytes, parts, options.memory_limit_bytes);
    const std::vector<Block> blocks = partition::partition_blocks(graph, components, options);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_valid_blocks(graph, blocks, options);
    if (optimum == std::numeric_limits<double>::infinity()) {
      EXPECT_GT(blocks.size(), static_cast<std::size_t>(parts));  // memory forces more blocks
      continue;
    }
    ASSERT_EQ(blocks.size(), static_cast<std::size_t>(parts));
    double largest = 0;
    for (const Block& block : blocks) largest = std::max(largest, block.compute_seconds);
    EXPECT_NEAR(largest, optimum, 1e-9 * optimum);
    // Contiguous in chain order.
    int next = 0;
    for (const Block& block : blocks)
      for (int task : block.tasks) EXPECT_EQ(task, next++);
  }
}

TEST(Blocks, CoarseningOnAChainMergesNeighboursIntoKContiguousBlocks) {
  const Graph graph = chain_graph(8);
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  BlockOptions options;
  options.blocks = 2;
  options.task_seconds = {1, 1, 1, 1, 1, 1, 1, 1};
  options.task_memory_bytes = {1, 1, 1, 1, 1, 1, 1, 1};
  options.merge_ceiling_sigmas = std::numeric_limits<double>::infinity();
  const BlockPartition result = partition::partition_blocks_detailed(graph, components, options);
  // Level 1 pairs (0,1) (2,3) (4,5) (6,7); level 2 pairs those; 8 -> 4 -> 2 groups.
  EXPECT_EQ(result.coarsening_levels, 2);
  EXPECT_EQ(result.coarsened_groups, 2u);
  ASSERT_EQ(result.blocks.size(), 2u);
  EXPECT_EQ(result.blocks[0].tasks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(result.blocks[1].tasks, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_DOUBLE_EQ(result.blocks[0].compute_seconds, 4);
  EXPECT_EQ(result.uncoarsening_moves, 0);  // every boundary on a chain of equal values costs the same

  // RaNNC's guard: equal groups have no spread, so every merge would exceed mean + 2 sigma and
  // compaction alone splits the chain.
  options.merge_ceiling_sigmas = 2;
  const BlockPartition guarded = partition::partition_blocks_detailed(graph, components, options);
  EXPECT_EQ(guarded.coarsening_levels, 0);
  EXPECT_EQ(guarded.coarsened_groups, 8u);
  ASSERT_EQ(guarded.blocks.size(), 2u);
  EXPECT_EQ(guarded.blocks[0].tasks, (std::vector<int>{0, 1, 2, 3}));
  // Costs 1, 1, 1, 5. Level 1 (mean 2, sigma sqrt 3, ceiling 5.46): (0, 1) merges, task 3 with
  // task 2 (6) may not. Level 2 (groups 2, 1, 5; ceiling 6.07): (01, 2) merges at 3. Level 3
  // (groups 3, 5; ceiling 6): the last merge (8) is refused, so compaction joins the two.
  const Graph short_chain = chain_graph(4);
  options.blocks = 1;
  options.task_seconds = {1, 1, 1, 5};
  options.task_memory_bytes = {1, 1, 1, 1};
  const BlockPartition heavy =
      partition::partition_blocks_detailed(short_chain, partition::atomic_components(short_chain), options);
  EXPECT_EQ(heavy.coarsening_levels, 2);
  EXPECT_EQ(heavy.coarsened_groups, 2u);
  ASSERT_EQ(heavy.blocks.size(), 1u);
  EXPECT_DOUBLE_EQ(heavy.blocks[0].compute_seconds, 8);
}

// x -> t0 (narrow) -> t1 (wide, 64) -> t2 (narrow) -> t3: coarsening pairs {t0, t1} {t2, t3}, which
// cuts the wide activation; uncoarsening moves t1 over so only t0's narrow output crosses.
TEST(Blocks, UncoarseningMovesTheBoundaryOffAWideActivation) {
  Graph graph;
  const int x = graph.add_input("x", {kBatch, 2});
  const int t0 = graph.add(OpType::MatMul, "t0", {x, graph.add_parameter("w0", {2, 2})});
  const int t1 = graph.add(OpType::MatMul, "t1", {t0, graph.add_parameter("w1", {2, 64})});
  const int t2 = graph.add(OpType::MatMul, "t2", {t1, graph.add_parameter("w2", {64, 2})});
  graph.mark_output(graph.add(OpType::Relu, "t3", {t2}));
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  BlockOptions options;
  options.blocks = 2;
  options.task_seconds = {1, 1, 1, 1};
  options.task_memory_bytes = {0, 0, 0, 0};
  options.bandwidth_bytes_per_second = 1;  // seconds = bytes
  options.batch = 3;
  options.merge_ceiling_sigmas = std::numeric_limits<double>::infinity();  // plain pairwise coarsening

  options.uncoarsen = false;
  const BlockPartition coarse = partition::partition_blocks_detailed(graph, components, options);
  ASSERT_EQ(coarse.blocks.size(), 2u);
  EXPECT_EQ(coarse.blocks[0].tasks, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(coarse.communication_seconds, 3 * 64 * 4);

  options.uncoarsen = true;
  const BlockPartition refined = partition::partition_blocks_detailed(graph, components, options);
  EXPECT_DOUBLE_EQ(refined.coarsened_communication_seconds, 3 * 64 * 4);
  EXPECT_DOUBLE_EQ(refined.uncoarsened_communication_seconds, 3 * 2 * 4);
  EXPECT_EQ(refined.uncoarsening_moves, 1);
  ASSERT_EQ(refined.blocks.size(), 2u);
  EXPECT_EQ(refined.blocks[0].tasks, (std::vector<int>{0}));
  EXPECT_EQ(refined.blocks[1].tasks, (std::vector<int>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(refined.communication_seconds, 3 * 2 * 4);
  expect_valid_blocks(graph, refined.blocks, options);

  // The move is refused when the receiving group would not fit.
  options.task_memory_bytes = {1, 1, 1, 1};
  options.memory_limit_bytes = 2;
  const BlockPartition tight = partition::partition_blocks_detailed(graph, components, options);
  EXPECT_EQ(tight.uncoarsening_moves, 0);
  EXPECT_DOUBLE_EQ(tight.communication_seconds, 3 * 64 * 4);
}

TEST(Blocks, UncoarseningNeverIncreasesCommunicationOnBert) {
  const Graph graph = build_model(testing::tiny_model_config("bert"));
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  int total_moves = 0;
  for (int k : {2, 4, 8, 16}) {
    BlockOptions options = analytic_options(graph, k);
    const BlockPartition result = partition::partition_blocks_detailed(graph, components, options);
    EXPECT_LE(result.uncoarsened_communication_seconds, result.coarsened_communication_seconds) << "k = " << k;
    if (result.uncoarsening_moves > 0) {
      EXPECT_LT(result.uncoarsened_communication_seconds, result.coarsened_communication_seconds) << "k = " << k;
    }
    total_moves += result.uncoarsening_moves;
  }
  EXPECT_GT(total_moves, 0);
}

// Random DAGs of Add/Relu tasks with long and short edges, repeated inputs and shared constant
// chains: every phase combination keeps the blocks valid, and uncoarsening never adds traffic.
TEST(Blocks, RandomDagsGiveValidBlocksUnderEveryPhaseAndMemoryLimit) {
  std::mt19937 random(2021);
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    Graph graph;
    std::vector<int> batch_values{graph.add_input("x", {kBatch, 8})};
    std::vector<int> constant_values{graph.add_parameter("p", {8}), graph.add_parameter("q", {8})};
    const int length = 5 + static_cast<int>(random() % 60);
    auto pick = [&](const std::vector<int>& pool) {
      // Mostly recent values (layer-like locality), sometimes any earlier one (skip connections).
      const std::size_t n = pool.size();
      if (random() % 4 == 0) return pool[random() % n];
      return pool[n - 1 - random() % std::min<std::size_t>(n, 3)];
    };
    for (int i = 0; i < length; ++i) {
      std::string name = "t";
      name += std::to_string(i);
      const unsigned kind = random() % 10;
      if (kind < 2) {
        constant_values.push_back(kind == 0 ? graph.add(OpType::Relu, name, {pick(constant_values)})
                                            : graph.add(OpType::Add, name, {pick(constant_values), pick(constant_values)}));
      } else if (kind < 5) {
        batch_values.push_back(graph.add(OpType::Relu, name, {pick(batch_values)}));
      } else if (kind < 7) {
        batch_values.push_back(graph.add(OpType::Add, name, {pick(batch_values), pick(constant_values)}));
      } else {
        const int a = pick(batch_values);
        batch_values.push_back(graph.add(OpType::Add, name, {a, random() % 5 == 0 ? a : pick(batch_values)}));
      }
    }
    graph.mark_output(batch_values.back());
    if (batch_values.size() < 2) continue;
    const std::vector<AtomicComponent> components = partition::atomic_components(graph);
    BlockOptions options;
    options.blocks = 1 + static_cast<int>(random() % 12);
    std::uniform_real_distribution<double> cost(0.0, 4.0);
    double largest = 0;
    for (std::size_t t = 0; t < graph.tasks().size(); ++t) {
      options.task_seconds.push_back(cost(random));
      options.task_memory_bytes.push_back(cost(random));
    }
    for (const AtomicComponent& component : components) {
      double bytes = 0;
      for (int task : component.tasks) bytes += options.task_memory_bytes[task];
      largest = std::max(largest, bytes);
    }
    // Slack: the limit is compared with sums taken in another order.
    if (trial % 2 == 0) options.memory_limit_bytes = largest * (1 + 1e-9) * (1 + (random() % 4));
    for (int phases = 0; phases < 4; ++phases) {
      options.coarsen = phases & 1;
      options.uncoarsen = phases & 2;
      const BlockPartition result = partition::partition_blocks_detailed(graph, components, options);
      expect_valid_blocks(graph, result.blocks, options);
      if (components.size() <= static_cast<std::size_t>(options.blocks)) {
        EXPECT_EQ(result.blocks.size(), components.size());
      } else if (options.memory_limit_bytes == std::numeric_limits<double>::infinity()) {
        EXPECT_EQ(result.blocks.size(), static_cast<std::size_t>(options.blocks));
      } else {
        EXPECT_GE(result.blocks.size(), static_cast<std::size_t>(options.blocks));
      }
      EXPECT_LE(result.uncoarsened_communication_seconds, result.coarsened_communication_seconds * (1 + 1e-12));
      EXPECT_NEAR(result.communication_seconds, partition::communication_seconds(graph, result.blocks, options),
                  1e-12);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(Blocks, MemoryLimitIsRespectedAndAnInfeasibleLimitIsAnError) {
  const Graph graph = build_model(testing::tiny_model_config("bert"));
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  BlockOptions options = analytic_options(graph, 2);
  double total = 0, largest_component = 0;
  for (const AtomicComponent& component : components) {
    double bytes = 0;
    for (int task : component.tasks) bytes += options.task_memory_bytes[task];
    largest_component = std::max(largest_component, bytes);
  }
  for (double bytes : options.task_memory_bytes) total += bytes;
  // The MLM decoder (tied 8000 x 128 embedding, its Adam state and [8, 64, 8000] logits) is the
  // largest component; a limit just above it cannot hold the model in 2 blocks.
  options.memory_limit_bytes = 1.05 * largest_component;
  ASSERT_GT(total, 2 * options.memory_limit_bytes);
  const std::vector<Block> blocks = partition::partition_blocks(graph, components, options);
  EXPECT_GE(static_cast<double>(blocks.size()), std::ceil(total / options.memory_limit_bytes));
  expect_valid_blocks(graph, blocks, options);
  // A limit with room gives exactly k blocks again.
  options.blocks = 4;
  options.memory_limit_bytes = total / 2;
  const std::vector<Block> roomy = partition::partition_blocks(graph, components, options);
  EXPECT_EQ(roomy.size(), 4u);
  expect_valid_blocks(graph, roomy, options);

  options.memory_limit_bytes = largest_component * 0.99;
  try {
    partition::partition_blocks(graph, components, options);
    FAIL() << "expected partrain::Error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("memory limit"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("smallest limit"), std::string::npos) << error.message();
  }
}

TEST(Blocks, BadOptionsAreErrors) {
  const Graph graph = chain_graph(4);
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  BlockOptions good;
  good.blocks = 2;
  good.task_seconds.assign(4, 1.0);
  good.task_memory_bytes.assign(4, 1.0);
  EXPECT_NO_THROW(partition::partition_blocks(graph, components, good));
  BlockOptions options = good;
  options.blocks = 0;
  EXPECT_THROW(partition::partition_blocks(graph, components, options), Error);
  options = good;
  options.task_seconds.pop_back();
  EXPECT_THROW(partition::partition_blocks(graph, components, options), Error);
  options = good;
  options.task_memory_bytes.push_back(1.0);
  EXPECT_THROW(partition::partition_blocks(graph, components, options), Error);
  options = good;
  options.bandwidth_bytes_per_second = 0;
  EXPECT_THROW(partition::partition_blocks(graph, components, options), Error);
  options = good;
  options.batch = 0;
  EXPECT_THROW(partition::partition_blocks(graph, components, options), Error);
  options = good;
  options.merge_ceiling_sigmas = -1;
  EXPECT_THROW(partition::partition_blocks(graph, components, options), Error);
  std::vector<AtomicComponent> missing = components;
  missing.pop_back();
  EXPECT_THROW(partition::partition_blocks(graph, missing, good), Error);
}

// RaNNC's enlarged BERT (256 layers, hidden 2048) into 32 blocks.
TEST(Blocks, EnlargedBert256LayersInto32Blocks) {
  ModelConfig config;
  config.type = "bert";
  config.layers = 256;
  config.hidden = 2048;
  config.heads = 16;
  config.seq_len = 512;
  config.vocab = 30522;
  using Clock = std::chrono::steady_clock;
  const auto built = Clock::now();
  const Graph graph = build_model(config);
  const auto started = Clock::now();
  const std::vector<AtomicComponent> components = partition::atomic_components(graph);
  const auto atomic_done = Clock::now();
  const BlockOptions options = analytic_options(graph, 32);
  const auto costed = Clock::now();
  const BlockPartition result = partition::partition_blocks_detailed(graph, components, options);
  const auto finished = Clock::now();
  auto seconds = [](auto from, auto to) { return std::chrono::duration<double>(to - from).count(); };
  std::cout << "[ enlarged BERT ] tasks " << graph.tasks().size() << ", components " << components.size()
            << ", build_model " << seconds(built, started) << " s, atomic " << seconds(started, atomic_done)
            << " s, blocks " << seconds(costed, finished) << " s (levels " << result.coarsening_levels
            << ", groups " << result.coarsened_groups << ", moves " << result.uncoarsening_moves
            << ", communication " << result.coarsened_communication_seconds << " -> "
            << result.uncoarsened_communication_seconds << " -> " << result.communication_seconds << " s)\n";
  ASSERT_EQ(result.blocks.size(), 32u);
  expect_valid_blocks(graph, result.blocks, options);
  EXPECT_LE(result.uncoarsened_communication_seconds, result.coarsened_communication_seconds);
  double total = 0, largest = 0;
  for (const Block& block : result.blocks) {
    total += block.compute_seconds;
    largest = std::max(largest, block.compute_seconds);
  }
  std::cout << "[ enlarged BERT ] largest block / mean block compute = " << largest / (total / 32) << "\n";
}

}  // namespace
}  // namespace partrain
