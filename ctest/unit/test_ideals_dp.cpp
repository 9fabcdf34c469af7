// Unit tests of the Tarnawski et al. ideal DP and DPL (src/partition/tarnawski/ideals_dp, dpl), the workload
// reader and memory-size parsing: a brute-force cross-check on small random DAGs, ideal counts of
// simple DAGs, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "partition/tarnawski/dpl.h"
#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/workload.h"
#include "support/workload_nodes.h"

namespace {

using partrain::partition::ClassGraph;
using partrain::partition::PartitionOptions;
using partrain::partition::Workload;
using partrain::partition::WorkloadEdge;
using partrain::partition::WorkloadNode;

using partrain::testing::make_node;

// A chain of `length` nodes starting at id `first` (colour = id).
void add_chain(Workload& workload, long first, long length) {
  for (long position = 0; position < length; ++position) {
    workload.nodes.push_back(make_node(first + position, false, first + position));
    if (position > 0) workload.edges.push_back({workload.nodes.size() - 2, workload.nodes.size() - 1, 0.0});
  }
}

std::size_t ideal_count(const Workload& workload, std::size_t cap = 1000000) {
  const ClassGraph graph(workload);
  return partrain::partition::enumerate_ideals(graph, cap, "test").size();
}

TEST(IdealsDp, ChainOfNHasNPlusOneIdeals) {
  for (long length : {1, 2, 5, 30, 70}) {
    Workload workload;
    add_chain(workload, 0, length);
    EXPECT_EQ(ideal_count(workload), static_cast<std::size_t>(length + 1)) << length;
  }
}

TEST(IdealsDp, TwoIndependentChainsHaveProductOfIdealCounts) {
  for (auto [a, b] : {std::pair<long, long>{1, 1}, {3, 4}, {7, 2}, {10, 12}}) {
    Workload workload;
    add_chain(workload, 0, a);
    add_chain(workload, 100, b);
    EXPECT_EQ(ideal_count(workload), static_cast<std::size_t>((a + 1) * (b + 1))) << a << "," << b;
  }
}

TEST(IdealsDp, IdealCapIsAClearErrorSuggestingDpl) {
  Workload workload;
  workload.source = "wide.json";
  workload.accelerators = 2;
  for (long chain = 0; chain < 6; ++chain) add_chain(workload, chain * 10, 5);  // 6^6 = 46656 ideals
  // Busy nodes: the DP contracts zero-latency chain ends into their neighbours (class_simplification.h).
  for (WorkloadNode& node : workload.nodes) node.accelerator_latency_ms = node.cpu_latency_ms = 1.0;
  PartitionOptions options;
  options.max_ideals = 1000;
  try {
    partrain::partition::partition_ideals(workload, options);
    FAIL() << "expected the ideal cap error";
  } catch (const partrain::Error& error) {
    EXPECT_NE(error.message().find("more than 1000 ideals"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("--planner dpl"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("wide.json"), std::string::npos) << error.message();
  }
  EXPECT_NO_THROW(partrain::partition::partition_linearised(workload, options));
}

// The cost model of EXPECTED.md evaluated directly on the original nodes for an assignment of
// colour classes (= forward node index here) to devices; +inf when infeasible.
double brute_force_max_load(const Workload& workload, const std::vector<std::size_t>& class_of_node,
                            const std::vector<int>& device_of_class, int accelerators, int devices) {
  double worst = 0.0;
  for (int device = 0; device < devices; ++device) {
    const bool accelerator = device < accelerators;
    auto inside = [&](std::size_t node) { return device_of_class[class_of_node[node]] == device; };
    double load = 0.0, size = 0.0;
    for (std::size_t node = 0; node < workload.nodes.size(); ++node) {
      if (!inside(node)) continue;
      const WorkloadNode& entry = workload.nodes[node];
      if (accelerator && !entry.supported_on_accelerator) return std::numeric_limits<double>::infinity();
      load += accelerator ? entry.accelerator_latency_ms : entry.cpu_latency_ms;
      size += entry.size_bytes;
    }
    if (accelerator) {
      if (size > workload.accelerator_memory_bytes) return std::numeric_limits<double>::infinity();
      for (std::size_t node = 0; node < workload.nodes.size(); ++node) {
        bool pays = false;
        double cost = 0.0;
        for (const WorkloadEdge& edge : workload.edges) {
          if (edge.source != node) continue;
          cost = edge.cost_ms;
          if (inside(node) != inside(edge.destination)) pays = true;
        }
        // x ∉ S with an edge into S, or x ∈ S with an edge out of S: counted once.
        if (pays) load += cost;
      }
    }
    worst = std::max(worst, load);
  }
  return worst;
}

// Devices' quotient graph must be acyclic (then the device sets are I \ I' of a chain of ideals).
bool contiguous(const std::vector<std::pair<int, int>>& arcs, const std::vector<int>& device_of_class, int devices) {
  std::vector<std::vector<bool>> reach(devices, std::vector<bool>(devices, false));
  for (auto [from, to] : arcs)
    if (device_of_class[from] != device_of_class[to]) reach[device_of_class[from]][device_of_class[to]] = true;
  for (int middle = 0; middle < devices; ++middle)
    for (int from = 0; from < devices; ++from)
      for (int to = 0; to < devices; ++to)
        if (reach[from][middle] && reach[middle][to]) reach[from][to] = true;
  for (int device = 0; device < devices; ++device)
    if (reach[device][device]) return false;
  return true;
}

TEST(IdealsDp, MatchesBruteForceOnSmallRandomDags) {
  std::mt19937 random(12345);
  std::uniform_real_distribution<double> latency(0.0, 10.0);
  int checked = 0, infeasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int forward_count = 2 + static_cast<int>(random() % 7);  // 2..8
    const bool training = trial % 2 == 1;
    const int accelerators = static_cast<int>(random() % 3);      // 0..2
    const int cpus = accelerators == 0 ? 1 + static_cast<int>(random() % 2) : static_cast<int>(random() % 2);
    const int devices = accelerators + cpus;
    Workload workload;
    workload.source = "random";
    workload.accelerators = accelerators;
    workload.cpus = cpus;
    std::vector<std::size_t> class_of_node;
    std::vector<double> out_cost(forward_count);
    for (int node = 0; node < forward_count; ++node) {
      WorkloadNode entry = make_node(node, false, node);
      entry.accelerator_latency_ms = latency(random);
      entry.cpu_latency_ms = 3.0 * latency(random);
      entry.size_bytes = static_cast<double>(random() % 100);
      entry.supported_on_accelerator = random() % 8 != 0;
      workload.nodes.push_back(entry);
      class_of_node.push_back(node);
      out_cost[node] = random() % 4 == 0 ? 0.0 : latency(random) / 2.0;
    }
    std::vector<std::pair<int, int>> arcs;
    for (int from = 0; from < forward_count; ++from)
      for (int to = from + 1; to < forward_count; ++to)
        if (random() % 3 == 0) {
          arcs.push_back({from, to});
          workload.edges.push_back({static_cast<std::size_t>(from), static_cast<std::size_t>(to), out_cost[from]});
        }
    if (training) {  // backward twins in the forward twin's class, edges reversed, fw -> bw edges
      for (int node = 0; node < forward_count; ++node) {
        WorkloadNode entry = make_node(100 + node, true, node);
        entry.accelerator_latency_ms = latency(random);
        entry.cpu_latency_ms = 2.0 * latency(random);
        entry.size_bytes = static_cast<double>(random() % 50);
        workload.nodes.push_back(entry);
        class_of_node.push_back(node);
      }
      const std::size_t forward_edges = workload.edges.size();
      for (std::size_t edge = 0; edge < forward_edges; ++edge) {
        const WorkloadEdge forward = workload.edges[edge];
        const double cost = out_cost[forward.destination] + 0.25;
        workload.edges.push_back({forward.destination + forward_count, forward.source + forward_count, cost});
        workload.edges.push_back({forward.source, forward.destination + forward_count, out_cost[forward.source]});
      }
    }
    workload.accelerator_memory_bytes = static_cast<double>(60 + random() % 300);

    double brute = std::numeric_limits<double>::infinity();
    std::vector<int> device_of_class(forward_count, 0);
    for (;;) {
      if (contiguous(arcs, device_of_class, devices))
        brute = std::min(brute, brute_force_max_load(workload, class_of_node, device_of_class, accelerators, devices));
      int position = 0;
      while (position < forward_count && ++device_of_class[position] == devices) device_of_class[position++] = 0;
      if (position == forward_count) break;
    }
    PartitionOptions options;
    if (!std::isfinite(brute)) {
      ++infeasible;
      EXPECT_THROW(partrain::partition::partition_ideals(workload, options), partrain::Error) << "trial " << trial;
      continue;
    }
    const auto optimal = partrain::partition::partition_ideals(workload, options);
    EXPECT_NEAR(optimal.max_load_ms, brute, 1e-9) << "trial " << trial;
    double worst = 0.0;
    for (const auto& device : optimal.devices) worst = std::max(worst, device.load_ms);
    EXPECT_NEAR(worst, optimal.max_load_ms, 1e-9) << "trial " << trial << ": reconstructed loads";
    try {
      EXPECT_GE(partrain::partition::partition_linearised(workload, options).max_load_ms, optimal.max_load_ms - 1e-9);
    } catch (const partrain::Error&) {
      // DPL may find no feasible prefix split where the full DP does.
    }
    ++checked;
  }
  EXPECT_GT(checked, 200);
  EXPECT_GT(infeasible, 0);
}

TEST(IdealsDp, DplOnAChainEqualsTheDp) {
  Workload workload;
  workload.accelerators = 2;
  workload.cpus = 1;
  workload.accelerator_memory_bytes = 1e9;
  add_chain(workload, 0, 6);
  for (std::size_t node = 0; node < workload.nodes.size(); ++node) {
    workload.nodes[node].accelerator_latency_ms = 1.0 + static_cast<double>(node);
    workload.nodes[node].cpu_latency_ms = 10.0;
  }
  for (WorkloadEdge& edge : workload.edges) edge.cost_ms = 0.5;
  const auto optimal = partrain::partition::partition_ideals(workload, {});
  EXPECT_DOUBLE_EQ(partrain::partition::partition_linearised(workload, {}).max_load_ms, optimal.max_load_ms);
  // Hand check: CPU {5} = 10; accelerators {0,1,2} = 6 + 0.5 (out of 2) = 6.5 and {3,4} = 9 + 0.5
  // (in from 2) + 0.5 (out of 4) = 10. Without the CPU the accelerators carry 21 + comm > 10.
  EXPECT_DOUBLE_EQ(optimal.max_load_ms, 10.0);
}

TEST(Workload, ParsesFlagsAsNumbersOrBooleansAndNamesBadKeys) {
  const nlohmann::json good = nlohmann::json::parse(R"({"maxSizePerFPGA": 100.0, "maxFPGAs": 2, "maxCPUs": 1,
    "nodes": [{"id": 5, "supportedOnFpga": true, "cpuLatency": 1, "fpgaLatency": 0.5, "isBackwardNode": 0, "size": 3, "name": "a"},
              {"id": 7, "supportedOnFpga": 0, "cpuLatency": 2, "fpgaLatency": 0.25, "isBackwardNode": false, "colorClass": 7, "size": 4}],
    "edges": [{"sourceId": 5, "destId": 7, "cost": 0.125, "size": 1}]})");
  const Workload workload = partrain::partition::parse_workload(good, "good.json");
  ASSERT_EQ(workload.nodes.size(), 2u);
  EXPECT_TRUE(workload.nodes[0].supported_on_accelerator);
  EXPECT_FALSE(workload.nodes[1].supported_on_accelerator);
  EXPECT_FALSE(workload.nodes[0].has_color_class);
  EXPECT_EQ(workload.edges[0].destination, 1u);
  EXPECT_DOUBLE_EQ(workload.edges[0].cost_ms, 0.125);

  nlohmann::json missing = good;
  missing["nodes"][1].erase("fpgaLatency");
  try {
    partrain::partition::parse_workload(missing, "bad.json");
    FAIL();
  } catch (const partrain::Error& error) {
    EXPECT_NE(error.message().find("bad.json: node 7: missing key 'fpgaLatency'"), std::string::npos) << error.message();
  }
  nlohmann::json unknown = good;
  unknown["edges"][0]["destId"] = 9;
  try {
    partrain::partition::parse_workload(unknown, "bad.json");
    FAIL();
  } catch (const partrain::Error& error) {
    EXPECT_NE(error.message().find("unknown destination node 9"), std::string::npos) << error.message();
  }
  EXPECT_THROW(partrain::partition::read_workload("/nonexistent/graph.json"), partrain::Error);
}

TEST(Units, ParsesMemorySizes) {
  EXPECT_EQ(partrain::parse_memory_size("8GiB"), 8ull << 30);
  EXPECT_EQ(partrain::parse_memory_size("512MiB"), 512ull << 20);
  EXPECT_EQ(partrain::parse_memory_size("16GB"), 16000000000ull);
  EXPECT_EQ(partrain::parse_memory_size("1024"), 1024ull);
  EXPECT_EQ(partrain::parse_memory_size("1.5kib"), 1536ull);
  for (const char* bad : {"", "GiB", "8 parsecs", "-1GiB"}) {
    try {
      partrain::parse_memory_size(bad);
      FAIL() << bad;
    } catch (const partrain::Error& error) {
      EXPECT_NE(error.message().find(std::string("'") + bad + "'"), std::string::npos) << error.message();
    }
  }
}

}  // namespace
