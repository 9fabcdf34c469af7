// Unit tests of the CBC layer (partition/tarnawski/mip_solver) and of Tarnawski et al.'s integer programs
// (partition/tarnawski/integer_program): small MIPs with known optima, and every program against brute force
// over all placements of small random DAGs, evaluated here directly from the cost model of
// ctest/data/dnn-partitioning/EXPECTED.md and the §4 schedule (not with partition/
// placement_evaluation), plus the ideal DP for the contiguous optimum and hand-checked latencies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/integer_program.h"
#include "partition/tarnawski/mip_solver.h"
#include "partition/tarnawski/workload.h"
#include "support/workload_nodes.h"

namespace {

using partrain::partition::IntegerProgramOptions;
using partrain::partition::IpContiguity;
using partrain::partition::IpObjective;
using partrain::partition::MipModel;
using partrain::partition::MipOptions;
using partrain::partition::MipStatus;
using partrain::partition::Workload;
using partrain::partition::WorkloadEdge;
using partrain::partition::WorkloadNode;

constexpr double infinity = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------- the CBC layer

TEST(MipSolver, SolvesASmallKnapsackToItsKnownOptimum) {
  // max 5a + 4b + 3c, 2a + 3b + c ≤ 5, binary: a = b = 1 (value 9, weight 5) beats a = c = 1 (8)
  // and b = c = 1 (7); all three weigh 6.
  MipModel model;
  const int a = model.add_binary(-5.0), b = model.add_binary(-4.0), c = model.add_binary(-3.0);
  model.add_row({{a, 2.0}, {b, 3.0}, {c, 1.0}}, -MipModel::infinity, 5.0);
  const auto solution = partrain::partition::solve_mip(model, MipOptions{});
  ASSERT_EQ(solution.status, MipStatus::optimal);
  EXPECT_NEAR(solution.objective, -9.0, 1e-9);
  EXPECT_NEAR(solution.values[a], 1.0, 1e-9);
  EXPECT_NEAR(solution.values[b], 1.0, 1e-9);
  EXPECT_NEAR(solution.values[c], 0.0, 1e-9);
  EXPECT_NEAR(solution.gap, 0.0, 1e-9);
  EXPECT_TRUE(model.feasible(solution.values));

  // The LP-format copy for other solvers: the objective, the row and the integer section.
  const std::string path = ::testing::TempDir() + "knapsack";
  partrain::partition::write_mip_lp(model, path);
  std::ifstream written(path + ".lp");
  const std::string text((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("Minimize"), std::string::npos) << text;
  EXPECT_NE(text.find("2 x0 + 3 x1 + x2 <= 5"), std::string::npos) << text;
  EXPECT_NE(text.find("Integers"), std::string::npos) << text;
}

TEST(MipSolver, GeneralIntegersStartsAndInfeasibility) {
  // max x, 3x ≤ 10, x integer in [0, 10]: x = 3 (the LP says 3.33).
  MipModel model;
  const int x = model.add_column(0.0, 10.0, -1.0, true);
  model.add_row({{x, 2.0}, {x, 1.0}}, -MipModel::infinity, 10.0);  // repeated columns add up: 3x
  EXPECT_EQ(model.nonzeros(), 1u);
  MipOptions options;
  options.start = {2.0};  // feasible, not optimal
  const auto solution = partrain::partition::solve_mip(model, options);
  ASSERT_EQ(solution.status, MipStatus::optimal);
  EXPECT_NEAR(solution.values[x], 3.0, 1e-9);
  EXPECT_FALSE(model.feasible({4.0}));
  EXPECT_FALSE(model.feasible({2.5}));

  MipModel impossible;
  const int y = impossible.add_binary(1.0);
  impossible.add_row({{y, 1.0}}, 2.0, MipModel::infinity);
  EXPECT_EQ(partrain::partition::solve_mip(impossible, MipOptions{}).status, MipStatus::infeasible);

  options.start = {1.0, 2.0};
  EXPECT_THROW(partrain::partition::solve_mip(model, options), partrain::Error);  // wrong length

  // No integer column: CBC solves a linear program; min x + y, x + 2y ≥ 4, x ≤ 1: y = 2 − x/2 makes
  // the objective 2 + x/2, least at x = 0, y = 2.
  MipModel linear;
  const int u = linear.add_column(0.0, 1.0, 1.0, false), v = linear.add_column(0.0, 10.0, 1.0, false);
  linear.add_row({{u, 1.0}, {v, 2.0}}, 4.0, MipModel::infinity);
  const auto lp = partrain::partition::solve_mip(linear, MipOptions{});
  ASSERT_EQ(lp.status, MipStatus::optimal);
  EXPECT_NEAR(lp.objective, 2.0, 1e-9);
  EXPECT_NEAR(lp.values[v], 2.0, 1e-9);
  EXPECT_NEAR(lp.gap, 0.0, 1e-12);
}

// ---------------------------------------------------------------- random workloads

using partrain::testing::make_node;

// A random DAG of `forward_count` forward nodes (class = index), arcs from lower to higher index;
// for training each node gets a backward twin in its class with the arcs reversed (as the
// operator-graph files have them). `arcs` receives the forward arcs.
Workload random_workload(std::mt19937& random, int forward_count, bool training, int accelerators, int cpus,
                         std::vector<std::pair<int, int>>& arcs) {
  std::uniform_real_distribution<double> latency(0.0, 10.0);
  Workload workload;
  workload.source = "random";
  workload.accelerators = accelerators;
  workload.cpus = cpus;
  std::vector<double> out_cost(static_cast<std::size_t>(forward_count));
  for (int node = 0; node < forward_count; ++node) {
    WorkloadNode entry = make_node(node, false, node);
    entry.accelerator_latency_ms = latency(random);
    entry.cpu_latency_ms = 3.0 * latency(random);
    entry.size_bytes = static_cast<double>(random() % 100);
    entry.supported_on_accelerator = random() % 8 != 0;
    workload.nodes.push_back(entry);
    out_cost[static_cast<std::size_t>(node)] = random() % 4 == 0 ? 0.0 : latency(random) / 2.0;
  }
  arcs.clear();
  for (int from = 0; from < forward_count; ++from)
    for (int to = from + 1; to < forward_count; ++to)
      if (random() % 3 == 0) {
        arcs.push_back({from, to});
        workload.edges.push_back({static_cast<std::size_t>(from), static_cast<std::size_t>(to), out_cost[static_cast<std::size_t>(from)]});
      }
  if (training) {
    for (int node = 0; node < forward_count; ++node) {
      WorkloadNode entry = make_node(100 + node, true, node);
      entry.accelerator_latency_ms = latency(random);
      entry.cpu_latency_ms = 2.0 * latency(random);
      entry.size_bytes = static_cast<double>(random() % 50);
      workload.nodes.push_back(entry);
    }
    const std::size_t forward_edges = workload.edges.size();
    for (std::size_t edge = 0; edge < forward_edges; ++edge) {
      const WorkloadEdge forward = workload.edges[edge];
      const auto count = static_cast<std::size_t>(forward_count);
      workload.edges.push_back({forward.destination + count, forward.source + count, out_cost[forward.destination] + 0.25});
      workload.edges.push_back({forward.source, forward.destination + count, out_cost[forward.source]});
    }
  }
  workload.accelerator_memory_bytes = static_cast<double>(60 + random() % 300);
  return workload;
}

// Class of every node: the forward index (backward twins share it).
std::vector<int> classes_of(const Workload& workload, int forward_count) {
  std::vector<int> result;
  for (std::size_t node = 0; node < workload.nodes.size(); ++node) result.push_back(static_cast<int>(node) % forward_count);
  return result;
}

// Cost of one subgraph (the nodes whose class `inside` accepts) on an accelerator or a CPU, straight
// from EXPECTED.md; +inf when an accelerator cannot hold it.
double subgraph_load(const Workload& workload, const std::vector<int>& class_of_node, bool accelerator,
                     const std::function<bool(int)>& inside) {
  double load = 0.0, size = 0.0;
  for (std::size_t node = 0; node < workload.nodes.size(); ++node) {
    if (!inside(class_of_node[node])) continue;
    const WorkloadNode& entry = workload.nodes[node];
    if (accelerator && !entry.supported_on_accelerator) return infinity;
    load += accelerator ? entry.accelerator_latency_ms : entry.cpu_latency_ms;
    size += entry.size_bytes;
  }
  if (!accelerator) return load;
  if (size > workload.accelerator_memory_bytes) return infinity;
  for (std::size_t node = 0; node < workload.nodes.size(); ++node) {
    bool pays = false;
    double cost = 0.0;
    for (const WorkloadEdge& edge : workload.edges) {
      if (edge.source != node) continue;
      cost = edge.cost_ms;
      if (inside(class_of_node[node]) != inside(class_of_node[edge.destination])) pays = true;
    }
    if (pays) load += cost;  // x ∈ S with an edge out of S, or x ∉ S with an edge into S: once
  }
  return load;
}

// Reachability between forward classes (transitive closure of the arcs).
std::vector<std::vector<bool>> reachability(const std::vector<std::pair<int, int>>& arcs, int count) {
  std::vector<std::vector<bool>> reach(static_cast<std::size_t>(count), std::vector<bool>(static_cast<std::size_t>(count), false));
  for (auto [from, to] : arcs) reach[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)] = true;
  for (int middle = 0; middle < count; ++middle)
    for (int from = 0; from < count; ++from)
      for (int to = 0; to < count; ++to)
        if (reach[static_cast<std::size_t>(from)][static_cast<std::size_t>(middle)] && reach[static_cast<std::size_t>(middle)][static_cast<std::size_t>(to)])
          reach[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)] = true;
  return reach;
}

// Definition 3.1: no u ∈ S, v ∉ S, w ∈ S with v reachable from u and w from v.
bool set_contiguous(const std::vector<std::vector<bool>>& reach, const std::vector<int>& group_of_class, int group) {
  const auto count = group_of_class.size();
  for (std::size_t u = 0; u < count; ++u)
    for (std::size_t v = 0; v < count; ++v)
      for (std::size_t w = 0; w < count; ++w)
        if (group_of_class[u] == group && group_of_class[v] != group && group_of_class[w] == group && reach[u][v] && reach[v][w])
          return false;
  return true;
}

// Whether the device sets form a pipeline: their quotient graph is acyclic (a chain of ideals).
bool quotient_acyclic(const std::vector<std::pair<int, int>>& arcs, const std::vector<int>& device_of_class, int devices) {
  std::vector<std::pair<int, int>> device_arcs;
  for (auto [from, to] : arcs)
    if (device_of_class[static_cast<std::size_t>(from)] != device_of_class[static_cast<std::size_t>(to)])
      device_arcs.push_back({device_of_class[static_cast<std::size_t>(from)], device_of_class[static_cast<std::size_t>(to)]});
  const auto reach = reachability(device_arcs, devices);
  for (int device = 0; device < devices; ++device)
    if (reach[static_cast<std::size_t>(device)][static_cast<std::size_t>(device)]) return false;
  return true;
}

// Calls visit(assignment) for every assignment of `count` items to `values` values.
void for_each_assignment(int count, int values, const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> assignment(static_cast<std::size_t>(count), 0);
  for (;;) {
    visit(assignment);
    int position = 0;
    while (position < count && ++assignment[static_cast<std::size_t>(position)] == values) assignment[static_cast<std::size_t>(position++)] = 0;
    if (position == count) return;
  }
}

struct BruteForce {
  double non_contiguous = infinity;  // any placement
  double contiguous = infinity;      // every device set contiguous (Definition 3.1)
  double pipeline = infinity;        // device sets ordered as a pipeline (the DP's space)
};

BruteForce brute_force_max_load(const Workload& workload, int forward_count, const std::vector<std::pair<int, int>>& arcs) {
  const std::vector<int> class_of_node = classes_of(workload, forward_count);
  const int devices = workload.accelerators + workload.cpus;
  const auto reach = reachability(arcs, forward_count);
  BruteForce best;
  for_each_assignment(forward_count, devices, [&](const std::vector<int>& device_of_class) {
    double worst = 0.0;
    bool contiguous = true;
    for (int device = 0; device < devices; ++device) {
      worst = std::max(worst, subgraph_load(workload, class_of_node, device < workload.accelerators,
                                            [&](int c) { return device_of_class[static_cast<std::size_t>(c)] == device; }));
      contiguous = contiguous && set_contiguous(reach, device_of_class, device);
    }
    best.non_contiguous = std::min(best.non_contiguous, worst);
    if (contiguous) best.contiguous = std::min(best.contiguous, worst);
    if (quotient_acyclic(arcs, device_of_class, devices)) best.pipeline = std::min(best.pipeline, worst);
  });
  return best;
}

// The §4 latency of placing class c on subgraph (device, slot) = subgraph_of_class[c] / slots,
// % slots: every subgraph contiguous and its device's memory within the limit, a subgraph starts
// when its inputs from other subgraphs are in RAM (their subgraphs finished) and its device's
// previous non-empty slot finished, and runs for its load. +inf when infeasible or cyclic.
double brute_force_latency(const Workload& workload, int forward_count, const std::vector<std::pair<int, int>>& arcs,
                           const std::vector<int>& subgraph_of_class, int slots) {
  const std::vector<int> class_of_node = classes_of(workload, forward_count);
  const int devices = workload.accelerators + workload.cpus;
  const int subgraphs = devices * slots;
  const auto reach = reachability(arcs, forward_count);
  std::vector<double> duration(static_cast<std::size_t>(subgraphs), 0.0);
  std::vector<bool> used(static_cast<std::size_t>(subgraphs), false);
  for (int c : subgraph_of_class) used[static_cast<std::size_t>(c)] = true;
  for (int device = 0; device < devices; ++device) {
    const bool accelerator = device < workload.accelerators;
    // Memory and support over the whole device.
    if (accelerator && !std::isfinite(subgraph_load(workload, class_of_node, true, [&](int c) {
          return subgraph_of_class[static_cast<std::size_t>(c)] / slots == device;
        })))
      return infinity;
    for (int slot = 0; slot < slots; ++slot) {
      const int s = device * slots + slot;
      if (!set_contiguous(reach, subgraph_of_class, s)) return infinity;
      Workload unlimited = workload;
      unlimited.accelerator_memory_bytes = infinity;
      duration[static_cast<std::size_t>(s)] =
          subgraph_load(unlimited, class_of_node, accelerator, [&](int c) { return subgraph_of_class[static_cast<std::size_t>(c)] == s; });
    }
  }
  // Subgraph precedence: data arcs and slot order; longest path by relaxation (acyclic ⇔ it settles).
  std::vector<std::pair<int, int>> order;
  for (auto [from, to] : arcs) {
    const int a = subgraph_of_class[static_cast<std::size_t>(from)], b = subgraph_of_class[static_cast<std::size_t>(to)];
    if (a != b) order.push_back({a, b});
  }
  for (int device = 0; device < devices; ++device) {
    int previous = -1;
    for (int slot = 0; slot < slots; ++slot) {
      const int s = device * slots + slot;
      if (!used[static_cast<std::size_t>(s)]) continue;
      if (previous >= 0) order.push_back({previous, s});
      previous = s;
    }
  }
  std::vector<double> finish(static_cast<std::size_t>(subgraphs), 0.0);
  for (int s = 0; s < subgraphs; ++s) finish[static_cast<std::size_t>(s)] = duration[static_cast<std::size_t>(s)];
  for (int round = 0; round <= subgraphs; ++round) {
    bool changed = false;
    for (auto [a, b] : order) {
      const double candidate = finish[static_cast<std::size_t>(a)] + duration[static_cast<std::size_t>(b)];
      if (candidate > finish[static_cast<std::size_t>(b)] + 1e-12) {
        finish[static_cast<std::size_t>(b)] = candidate;
        changed = true;
      }
    }
    if (!changed) return *std::max_element(finish.begin(), finish.end());
  }
  return infinity;  // still growing after |subgraphs| rounds: a cycle
}

// What the program's placement costs under this file's own evaluation of the cost model.
double evaluated_max_load(const Workload& workload, int forward_count, const partrain::partition::IntegerProgramResult& result) {
  const std::vector<int> class_of_node = classes_of(workload, forward_count);
  double worst = 0.0;
  for (int device = 0; device < result.placement.devices(); ++device)
    worst = std::max(worst, subgraph_load(workload, class_of_node, device < result.placement.accelerators, [&](int c) {
                       return result.placement.device_of_class[static_cast<std::size_t>(c)] == device;
                     }));
  return worst;
}

IntegerProgramOptions exact_options() {
  IntegerProgramOptions options;
  options.relative_gap = 0.0;
  options.time_limit_seconds = 60.0;
  return options;
}

TEST(ThroughputIp, EveryProgramMatchesBruteForceOnSmallRandomDags) {
  std::mt19937 random(2020);
  int checked = 0, infeasible = 0, non_contiguous_better = 0, reachability_better = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const int forward_count = 2 + static_cast<int>(random() % 5);  // 2..6
    const bool training = trial % 2 == 1;
    const int accelerators = 1 + static_cast<int>(random() % 2);  // 1..2
    const int cpus = static_cast<int>(random() % 2);
    std::vector<std::pair<int, int>> arcs;
    const Workload workload = random_workload(random, forward_count, training, accelerators, cpus, arcs);
    const BruteForce brute = brute_force_max_load(workload, forward_count, arcs);
    const std::string what = "trial " + std::to_string(trial);
    if (!std::isfinite(brute.non_contiguous)) {
      ++infeasible;
      EXPECT_THROW(partrain::partition::solve_throughput_ip(workload, exact_options()), partrain::Error) << what;
      continue;
    }
    IntegerProgramOptions options = exact_options();
    options.warm_start = trial % 3 != 0;
    options.break_symmetry = trial % 4 == 1;
    const auto free = partrain::partition::solve_throughput_ip(workload, options);
    ASSERT_EQ(free.status, MipStatus::optimal) << what;
    EXPECT_NEAR(free.objective_ms, brute.non_contiguous, 1e-6) << what << ": non-contiguous (§5.2)";
    EXPECT_NEAR(evaluated_max_load(workload, forward_count, free), free.objective_ms, 1e-9) << what;
    EXPECT_LE(free.bound_ms, free.objective_ms + 1e-9) << what;

    options.contiguous = true;
    for (IpContiguity contiguity : {IpContiguity::pipeline, IpContiguity::reachability}) {
      options.contiguity = contiguity;
      const double expected = contiguity == IpContiguity::pipeline ? brute.pipeline : brute.contiguous;
      const std::string which = what + (contiguity == IpContiguity::pipeline ? ": pipeline" : ": reachability (16)");
      if (!std::isfinite(expected)) {
        EXPECT_THROW(partrain::partition::solve_throughput_ip(workload, options), partrain::Error) << which;
        continue;
      }
      const auto result = partrain::partition::solve_throughput_ip(workload, options);
      ASSERT_EQ(result.status, MipStatus::optimal) << which;
      EXPECT_NEAR(result.objective_ms, expected, 1e-6) << which;
      EXPECT_NEAR(evaluated_max_load(workload, forward_count, result), result.objective_ms, 1e-9) << which;
      EXPECT_TRUE(result.placement_contiguous) << which;
      if (contiguity == IpContiguity::pipeline) {
        EXPECT_TRUE(result.pipeline_ordered) << which;
        // The ideal DP searches the same space.
        EXPECT_NEAR(partrain::partition::partition_ideals(workload, {}).max_load_ms, result.objective_ms, 1e-6) << which;
      }
    }
    non_contiguous_better += brute.non_contiguous < brute.contiguous - 1e-9;
    reachability_better += std::isfinite(brute.contiguous) && brute.contiguous < brute.pipeline - 1e-9;
    ++checked;
  }
  EXPECT_GT(checked, 30);
  EXPECT_GT(infeasible, 0);
  EXPECT_GT(non_contiguous_better, 0);  // the random graphs do exercise §5.2's gain
  std::printf("checked %d, infeasible %d, non-contiguous better %d, reachability better than pipeline %d\n", checked,
              infeasible, non_contiguous_better, reachability_better);
}

TEST(LatencyIp, MatchesBruteForceOnSmallRandomDagsWithOneAndTwoSubgraphsPerDevice) {
  std::mt19937 random(42);
  int checked = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int forward_count = 2 + static_cast<int>(random() % 4);  // 2..5
    const int accelerators = 1 + static_cast<int>(random() % 2);
    const int cpus = static_cast<int>(random() % 2);
    const int slots = 1 + trial % 2;
    std::vector<std::pair<int, int>> arcs;
    const Workload workload = random_workload(random, forward_count, false, accelerators, cpus, arcs);
    double brute = infinity;
    for_each_assignment(forward_count, (accelerators + cpus) * slots, [&](const std::vector<int>& subgraph_of_class) {
      brute = std::min(brute, brute_force_latency(workload, forward_count, arcs, subgraph_of_class, slots));
    });
    IntegerProgramOptions options = exact_options();
    options.objective = IpObjective::latency;
    options.subgraphs_per_device = slots;
    options.warm_start = trial % 3 != 0;
    const std::string what = "trial " + std::to_string(trial) + " (q = " + std::to_string(slots) + ")";
    if (!std::isfinite(brute)) {
      EXPECT_THROW(partrain::partition::solve_latency_ip(workload, options), partrain::Error) << what;
      continue;
    }
    const auto result = partrain::partition::solve_latency_ip(workload, options);
    ASSERT_EQ(result.status, MipStatus::optimal) << what;
    EXPECT_NEAR(result.objective_ms, brute, 1e-6) << what;
    std::vector<int> subgraph_of_class;
    for (int c = 0; c < forward_count; ++c)
      subgraph_of_class.push_back(result.placement.device_of_class[static_cast<std::size_t>(c)] * slots +
                                  result.placement.slot(static_cast<std::size_t>(c)));
    EXPECT_NEAR(brute_force_latency(workload, forward_count, arcs, subgraph_of_class, slots), result.objective_ms, 1e-9) << what;
    ++checked;
  }
  EXPECT_GT(checked, 16);
}

// A diamond a -> {b, c} -> d: b and c (10 ms each) can run side by side, but a device's subgraph
// publishes its outputs only when it finishes, so the source and the sink need subgraphs of their
// own. Hand-computed (ms): one accelerator 1 + 10 + 10 + 1 = 22; a | b | c | d on four takes
// a 1 + 0.5 out = 1.5, then b and c each 0.5 in + 10 + 0.5 out = 11 (to 12.5), then d
// 0.5 + 0.5 in + 1 = 2: 14.5; three devices with two slots each do the same (a, d on one device).
TEST(LatencyIp, ParallelBranchesOfADiamondRunOnSeparateDevices) {
  Workload workload;
  workload.source = "diamond";
  workload.accelerator_memory_bytes = 1e9;
  workload.cpus = 0;
  const double work[] = {1.0, 10.0, 10.0, 1.0};
  for (int node = 0; node < 4; ++node) {
    WorkloadNode entry = make_node(node, false, node);
    entry.accelerator_latency_ms = work[node];
    entry.cpu_latency_ms = 100.0;
    workload.nodes.push_back(entry);
  }
  workload.edges = {{0, 1, 0.5}, {0, 2, 0.5}, {1, 3, 0.5}, {2, 3, 0.5}};
  IntegerProgramOptions options = exact_options();
  options.objective = IpObjective::latency;
  auto latency = [&](int accelerators, int slots) {
    options.accelerators = accelerators;
    options.subgraphs_per_device = slots;
    const auto result = partrain::partition::solve_integer_program(workload, options);
    EXPECT_EQ(result.status, MipStatus::optimal);
    return result.objective_ms;
  };
  EXPECT_NEAR(latency(1, 1), 22.0, 1e-9);
  EXPECT_NEAR(latency(4, 1), 14.5, 1e-9);
  EXPECT_NEAR(latency(3, 2), 14.5, 1e-9);
  // The throughput objective of the same graph on four devices: the largest load is b's or c's 11.
  options.objective = IpObjective::throughput;
  options.subgraphs_per_device = 1;
  options.accelerators = 4;
  EXPECT_NEAR(partrain::partition::solve_integer_program(workload, options).objective_ms, 11.0, 1e-9);
}

TEST(IntegerProgram, ErrorsNameTheProblem) {
  std::mt19937 random(7);
  std::vector<std::pair<int, int>> arcs;
  const Workload training = random_workload(random, 3, true, 1, 1, arcs);
  IntegerProgramOptions options;
  options.objective = IpObjective::latency;
  try {
    partrain::partition::solve_integer_program(training, options);
    FAIL() << "a training workload has no single-stream latency program";
  } catch (const partrain::Error& error) {
    EXPECT_NE(error.message().find("inference workloads"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("--objective throughput"), std::string::npos) << error.message();
  }
  Workload unsupported = random_workload(random, 3, false, 2, 0, arcs);
  unsupported.nodes[1].supported_on_accelerator = false;
  try {
    partrain::partition::solve_throughput_ip(unsupported, IntegerProgramOptions{});
    FAIL() << "node 1 fits nowhere";
  } catch (const partrain::Error& error) {
    EXPECT_NE(error.message().find("random: node 1 (fw1)"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("--cpus"), std::string::npos) << error.message();
  }
  EXPECT_THROW(partrain::partition::parse_ip_objective("speed", "--objective"), partrain::Error);
  EXPECT_EQ(partrain::partition::parse_ip_objective("latency", "--objective"), IpObjective::latency);
}

}  // namespace
