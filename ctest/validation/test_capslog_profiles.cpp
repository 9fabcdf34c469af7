// CAPSlog on real per-layer figures: the PipeDream profiles of VGG-16 and ResNet-50
// (ctest/data/pipedream-profiles, measured by the PipeDream authors). The layers are the profile's
// nodes in topological order with M_i = parameter bytes × 4 (fp32 weights, gradients and two AdamW
// moments) and M_a = activation bytes of the profiled minibatch per microbatch in flight. Checks:
// the binary-search recommender (CAPSlog Algorithm 2) equals brute force over every contiguous split
// for G = 2..4 under 1F1B; per-layer figures solved from the profiling partitionings (Algorithm 1)
// reproduce the recommendation; and the capslog planner makes a valid plan on the profile's layer
// graph and cost model.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "partition/capslog.h"
#include "partition/pipedream_profile.h"
#include "partition/plan_builder.h"
#include "partition/uniform.h"

namespace {

using namespace partrain;
using namespace partrain::partition;

std::string profile_path(const std::string& model) {
  return std::string(PARTRAIN_TEST_DATA) + "/pipedream-profiles/profiler/image_classification/profiles/" + model +
         "/graph.txt";
}

CapslogLayerMemory profile_memory(const PipeDreamProfile& profile) {
  CapslogLayerMemory memory;
  for (int node : profile.topological_order()) {
    memory.isolated.push_back(profile.nodes[node].parameter_bytes * 4.0);
    memory.activation.push_back(profile.nodes[node].activation_bytes);
  }
  return memory;
}

// Minimal largest device memory over all contiguous splits, by enumeration (prefix sums of the
// plain per-layer figures).
double brute_force(const CapslogLayerMemory& memory, const std::vector<int>& in_flight) {
  const int layers = static_cast<int>(memory.size()), devices = static_cast<int>(in_flight.size());
  std::vector<double> isolated(layers + 1, 0.0), activation(layers + 1, 0.0);
  for (int l = 0; l < layers; ++l) {
    isolated[l + 1] = isolated[l] + memory.isolated[l];
    activation[l + 1] = activation[l] + memory.activation[l];
  }
  double best = std::numeric_limits<double>::infinity();
  std::function<void(int, int, double)> recurse = [&](int device, int first, double largest) {
    if (largest >= best) return;
    if (device == devices - 1) {
      const double last = isolated[layers] - isolated[first] + in_flight[device] * (activation[layers] - activation[first]);
      best = std::min(best, std::max(largest, last));
      return;
    }
    for (int end = first + 1; end <= layers - (devices - 1 - device); ++end) {
      const double bytes = isolated[end] - isolated[first] + in_flight[device] * (activation[end] - activation[first]);
      recurse(device + 1, end, std::max(largest, bytes));
    }
  };
  recurse(0, 0, 0.0);
  return best;
}

class CapslogProfiles : public ::testing::TestWithParam<std::string> {};

TEST_P(CapslogProfiles, RecommenderMatchesBruteForce) {
  const PipeDreamProfile profile = read_pipedream_profile(profile_path(GetParam()));
  const CapslogLayerMemory memory = profile_memory(profile);
  ASSERT_GE(memory.size(), 40u);
  for (int devices = 2; devices <= 4; ++devices) {
    const std::vector<int> in_flight = capslog_in_flight_1f1b(devices);
    const CapslogPartition partition = capslog_recommend(memory, in_flight);
    const double best = brute_force(memory, in_flight);
    EXPECT_NEAR(partition.max_memory_bytes, best, 1e-9 * best) << GetParam() << " G = " << devices;
    int total = 0;
    for (int count : partition.layers_per_device) {
      EXPECT_GE(count, 1);
      total += count;
    }
    EXPECT_EQ(total, static_cast<int>(memory.size()));
    EXPECT_LE(partition.budget_steps, 66);
    // 1F1B: the first device keeps G microbatches; a balanced split gives it fewer layers' worth of
    // activations than an equal-layer split would. At least: no worse than the equal split.
    std::vector<int> equal(devices, static_cast<int>(memory.size()) / devices);
    equal.back() += static_cast<int>(memory.size()) % devices;
    const std::vector<double> equal_bytes = capslog_device_memory(memory, equal, in_flight);
    EXPECT_LE(partition.max_memory_bytes, *std::max_element(equal_bytes.begin(), equal_bytes.end()));
  }
}

TEST_P(CapslogProfiles, SolvedFiguresFromProfilingRunsGiveTheSameRecommendation) {
  const PipeDreamProfile profile = read_pipedream_profile(profile_path(GetParam()));
  const CapslogLayerMemory memory = profile_memory(profile);
  const int layers = static_cast<int>(memory.size());
  for (int devices = 2; devices <= 4; ++devices) {
    const std::vector<int> in_flight = capslog_in_flight_1f1b(devices);
    const std::vector<CapslogProfilingRun> runs = capslog_profiling_runs(layers, devices);
    // Trimmed profiling: O(L) runs, each measuring at most 4 devices.
    EXPECT_EQ(static_cast<int>(runs.size()), layers - devices + 1);
    std::vector<std::vector<double>> peaks;
    for (const CapslogProfilingRun& run : runs) peaks.push_back(capslog_device_memory(memory, run.layers_per_device, in_flight));
    const CapslogLayerMemory solved = capslog_solve_memory(layers, runs, peaks, in_flight);
    const double expected = capslog_recommend(memory, in_flight).max_memory_bytes;
    EXPECT_NEAR(capslog_recommend(solved, in_flight).max_memory_bytes, expected, 1e-6 * expected)
        << GetParam() << " G = " << devices;
  }
}

TEST_P(CapslogProfiles, PlannerMakesAValidPlanOnTheLayerGraph) {
  const PipeDreamProfile profile = read_pipedream_profile(profile_path(GetParam()));
  const Graph graph = layer_chain_graph(profile);
  DeviceSpec device;
  device.memory_bytes = 1e12;
  const std::unique_ptr<CostModel> cost = make_layer_profile_cost_model(profile, device, 128);
  PlannerOptions options;
  options.world_size = 4;
  options.stages = 4;
  options.global_batch = 128;
  options.microbatches = 4;
  const Plan plan = plan_capslog(graph, *cost, options);   // validated by plan_from_stages
  ASSERT_EQ(plan.stages.size(), 4u);
  // The stages are CAPSlog's recommendation for the cost model's per-layer figures at 32 samples.
  const std::vector<LayerGroup> groups = layer_groups(graph);
  CapslogLayerMemory memory;
  for (const LayerGroup& group : groups) {
    // Recomputation is on (recompute "auto", 4 stages): in-flight microbatches keep only the layer
    // inputs, one microbatch at a time holds the layer's activations.
    const profile::Measurement m = cost->measure(group.tasks, 32);
    memory.isolated.push_back(m.parameter_bytes * 4.0 + m.activation_bytes);
    memory.activation.push_back(m.boundary_input_bytes);
  }
  const CapslogPartition partition = capslog_recommend(memory, capslog_in_flight_1f1b(4));
  std::size_t first = 0;
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(plan.stages[s].tasks, join_groups(groups, first, first + partition.layers_per_device[s])) << s;
    first += partition.layers_per_device[s];
  }
}

INSTANTIATE_TEST_SUITE_P(PipeDream, CapslogProfiles, ::testing::Values("vgg16", "resnet50"));

}  // namespace
