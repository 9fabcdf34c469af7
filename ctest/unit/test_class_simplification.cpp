// Unit tests of the class simplification of the ideal DP (src/partition/tarnawski/class_simplification):
// hand-counted ideals for mirrored backward-only classes, fused cycles and trivial classes, and
// exactness on random workloads: the DP on the simplified classes finds the optimum of the DP on
// the plain colour classes, with and without binding memory.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "partition/tarnawski/class_simplification.h"
#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/workload.h"
#include "support/workload_nodes.h"

namespace {

using partrain::partition::ClassGraph;
using partrain::partition::ClassGraphOptions;
using partrain::partition::PartitionOptions;
using partrain::partition::Workload;
using partrain::partition::WorkloadNode;

using partrain::testing::make_node;

constexpr double infinity = std::numeric_limits<double>::infinity();

std::size_t simplified_ideals(const Workload& workload, double memory = infinity) {
  ClassGraphOptions options;
  options.simplify = true;
  options.accelerator_memory_bytes = memory;
  const ClassGraph graph(workload, options);
  return partrain::partition::enumerate_ideals(graph, 1000000, "test").size();
}

WorkloadNode node_with_latency(long id, bool backward, long color, double latency) {
  WorkloadNode node = make_node(id, backward, color);
  node.accelerator_latency_ms = latency;
  node.cpu_latency_ms = latency;
  return node;
}

// Forward chain a -> b -> c (colours 0, 1, 2, indices 0-2) with backward twins (indices 3-5) and
// reversed backward edges c' -> b' -> a'.
Workload chain_with_twins() {
  Workload workload;
  workload.source = "chain";
  workload.accelerators = 2;
  workload.accelerator_memory_bytes = 1e9;
  for (long color = 0; color < 3; ++color) workload.nodes.push_back(node_with_latency(color, false, color, 1.0));
  for (long color = 0; color < 3; ++color) workload.nodes.push_back(node_with_latency(10 + color, true, color, 2.0));
  workload.edges = {{0, 1, 0.1}, {1, 2, 0.1}, {5, 4, 0.1}, {4, 3, 0.1}};
  return workload;
}

TEST(ClassSimplification, BackwardOnlyClassMirrorsItsBackwardEdges) {
  // An orphan o (index 6) between c' and a': c' -> o -> a' mirrors to the arcs a -> o -> c, so the
  // ideals of {a < b < c, a < o < c} are {}, a, ab, ao, abo, abco: 6.
  Workload workload = chain_with_twins();
  workload.nodes.push_back(node_with_latency(20, true, 7, 1.0));
  workload.edges.push_back({5, 6, 0.1});
  workload.edges.push_back({6, 3, 0.1});
  EXPECT_EQ(simplified_ideals(workload), 6u);
  const auto simplified = partrain::partition::simplify_classes(workload, infinity);
  EXPECT_EQ(simplified.class_count, 4u);
  EXPECT_EQ(simplified.fused_classes, 0u);
}

TEST(ClassSimplification, CycleThroughABackwardOnlyClassIsFused) {
  // a' -> o -> c' mirrors to c -> o -> a, closing the cycle a -> b -> c -> o -> a: one class, and
  // the ideals are {} and everything.
  Workload workload = chain_with_twins();
  workload.nodes.push_back(node_with_latency(20, true, 7, 1.0));
  workload.edges.push_back({3, 6, 0.1});
  workload.edges.push_back({6, 5, 0.1});
  const auto simplified = partrain::partition::simplify_classes(workload, infinity);
  EXPECT_EQ(simplified.colour_class_count, 4u);
  EXPECT_EQ(simplified.fused_classes, 3u);
  EXPECT_EQ(simplified.class_count, 1u);
  EXPECT_EQ(simplified_ideals(workload), 2u);
  // The DP still places every node, on one device.
  const auto result = partrain::partition::partition_ideals(workload, {});
  ASSERT_EQ(result.devices.size(), 1u);
  EXPECT_EQ(result.devices[0].nodes.size(), workload.nodes.size());
}

// A zero-latency source s (index 3, colour 9) feeding the chain's head: s -> a -> b -> c.
Workload chain_with_trivial_source(double size, bool supported) {
  Workload workload;
  workload.source = "trivial";
  workload.accelerators = 2;
  workload.cpus = 1;
  workload.accelerator_memory_bytes = 100.0;
  for (long color = 0; color < 3; ++color) {
    workload.nodes.push_back(node_with_latency(color, false, color, 1.0));
    workload.nodes.back().size_bytes = 10.0;
  }
  WorkloadNode source = make_node(3, false, 9);
  source.size_bytes = size;
  source.supported_on_accelerator = supported;
  workload.nodes.push_back(source);
  workload.edges = {{0, 1, 0.1}, {1, 2, 0.1}, {3, 0, 0.5}};
  return workload;
}

TEST(ClassSimplification, TrivialClassJoinsItsOnlyNeighbourWhenThatIsExact) {
  // Contracted: a chain of 3 classes, 4 ideals (instead of 5).
  EXPECT_EQ(simplified_ideals(chain_with_trivial_source(0.0, true), 100.0), 4u);
  // Sized, but everything fits one accelerator: contracted.
  EXPECT_EQ(simplified_ideals(chain_with_trivial_source(50.0, true), 100.0), 4u);
  // Sized, and memory could bind: kept.
  EXPECT_EQ(simplified_ideals(chain_with_trivial_source(80.0, true), 100.0), 5u);
  // Unsupported on accelerators while its neighbour is: kept (they may have to be apart).
  EXPECT_EQ(simplified_ideals(chain_with_trivial_source(0.0, false), 100.0), 5u);
  // With any latency it is not trivial.
  Workload busy = chain_with_trivial_source(0.0, true);
  busy.nodes[3].cpu_latency_ms = 1e-9;
  EXPECT_EQ(simplified_ideals(busy, 100.0), 5u);
}

TEST(ClassSimplification, ChainsOfTrivialClassesContractCompletely) {
  // s2 -> s1 -> a -> b -> c with s1, s2 trivial: s2 joins s1 and then s1 joins a.
  Workload workload = chain_with_trivial_source(0.0, true);
  workload.nodes.push_back(make_node(4, false, 10));
  workload.edges.push_back({4, 3, 0.2});
  const auto simplified = partrain::partition::simplify_classes(workload, 100.0);
  EXPECT_EQ(simplified.contracted_classes, 2u);
  EXPECT_EQ(simplified.class_count, 3u);
}

// The optimum over the plain colour classes (every ideal, no simplification).
double plain_optimum(const Workload& workload, const PartitionOptions& options) {
  const ClassGraph graph(workload);
  const auto family = partrain::partition::enumerate_ideals(graph, 1000000, workload.source);
  return partrain::partition::partition_over_ideals(workload, graph, family, options).max_load_ms;
}

TEST(ClassSimplification, OptimaEqualThoseOfThePlainClassesOnRandomWorkloads) {
  std::mt19937 random(1717);
  std::uniform_real_distribution<double> latency(0.5, 10.0);
  int checked = 0, contracted = 0, infeasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int forward_count = 3 + static_cast<int>(random() % 6);  // 3..8
    const bool training = trial % 2 == 1;
    Workload workload;
    workload.source = "random " + std::to_string(trial);
    workload.accelerators = 1 + static_cast<int>(random() % 3);
    workload.cpus = static_cast<int>(random() % 2);
    std::vector<double> out_cost(static_cast<std::size_t>(forward_count));
    std::vector<bool> trivial(static_cast<std::size_t>(forward_count));
    for (int node = 0; node < forward_count; ++node) {
      trivial[static_cast<std::size_t>(node)] = random() % 3 == 0;
      WorkloadNode entry = node_with_latency(node, false, node, trivial[static_cast<std::size_t>(node)] ? 0.0 : latency(random));
      entry.size_bytes = random() % 2 == 0 ? 0.0 : static_cast<double>(random() % 60);
      entry.supported_on_accelerator = random() % 6 != 0;
      workload.nodes.push_back(entry);
      out_cost[static_cast<std::size_t>(node)] = random() % 4 == 0 ? 0.0 : latency(random) / 2.0;
    }
    // Sparse random DAG (leaves, and so trivial leaves, are common).
    for (int to = 1; to < forward_count; ++to) {
      const int from = static_cast<int>(random() % static_cast<unsigned>(to));
      workload.edges.push_back({static_cast<std::size_t>(from), static_cast<std::size_t>(to), out_cost[static_cast<std::size_t>(from)]});
      if (random() % 4 == 0 && from + 1 < to)
        workload.edges.push_back({static_cast<std::size_t>(from + 1), static_cast<std::size_t>(to), out_cost[static_cast<std::size_t>(from + 1)]});
    }
    if (training) {  // twins (zero latency with trivial forward nodes), reversed edges
      const auto count = static_cast<std::size_t>(forward_count);
      for (int node = 0; node < forward_count; ++node) {
        WorkloadNode entry = node_with_latency(100 + node, true, node, trivial[static_cast<std::size_t>(node)] ? 0.0 : latency(random));
        entry.size_bytes = workload.nodes[static_cast<std::size_t>(node)].size_bytes;
        workload.nodes.push_back(entry);
      }
      const std::size_t forward_edges = workload.edges.size();
      for (std::size_t edge = 0; edge < forward_edges; ++edge) {
        const auto forward = workload.edges[edge];
        workload.edges.push_back({forward.destination + count, forward.source + count, out_cost[forward.destination] + 0.25});
      }
    }
    double total = 0.0;
    for (const WorkloadNode& entry : workload.nodes) total += entry.size_bytes;
    // Half the trials with memory that can bind, half where everything fits one accelerator.
    workload.accelerator_memory_bytes = trial % 4 < 2 ? total + 1.0 : 20.0 + static_cast<double>(random() % 80);
    PartitionOptions options;
    double expected = infinity;
    try {
      expected = plain_optimum(workload, options);
    } catch (const partrain::Error&) {
      ++infeasible;
      EXPECT_THROW(partrain::partition::partition_ideals(workload, options), partrain::Error) << workload.source;
      continue;
    }
    const auto result = partrain::partition::partition_ideals(workload, options);
    EXPECT_NEAR(result.max_load_ms, expected, 1e-9) << workload.source;
    const ClassGraph plain(workload);
    contracted += result.class_count < plain.class_count;
    ++checked;
  }
  EXPECT_GT(checked, 200);
  EXPECT_GT(contracted, 100);  // the trials do exercise the contraction
  EXPECT_GT(infeasible, 0);
}

}  // namespace
