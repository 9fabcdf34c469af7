// Validation on real measured layer costs: the PipeDream per-layer profiles (msr-fiddle/pipedream,
// ctest/data/pipedream-profiles, FORMAT.md). Every graph.txt must parse with the numbers of the file,
// build a layer graph, and RaNNC's stage DP (Tanaka et al. IPDPS 2021 §III-C, src/partition/rannc/stage_dp)
// on 8 blocks of consecutive layers of VGG-16, ResNet-50 and AlexNet must find the same optimal step
// time as a brute force over every stage split, replica assignment, pipeline size and microbatch
// count, on 4 and 8 devices with PipeDream's 16 GB devices and 1 GB/s links.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "partition/common/cost_model.h"
#include "partition/common/pipedream_profile.h"
#include "partition/common/plan_builder.h"
#include "partition/rannc/stage_dp.h"
#include "support/brute_force.h"

namespace {

using partrain::Plan;
using partrain::PlanStage;
using partrain::partition::CostModel;
using partrain::partition::DeviceSpec;
using partrain::partition::PipeDreamProfile;
using partrain::partition::PlannerOptions;
using partrain::testing::closed_form_step_seconds;
using partrain::testing::compositions;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string data_path(const std::string& relative) {
  return std::string(PARTRAIN_TEST_DATA) + "/pipedream-profiles/" + relative;
}

std::string profile_path(const std::string& model) {
  const std::string family = model == "gnmt" ? "translation" : "image_classification";
  return data_path("profiler/" + family + "/profiles/" + model + "/graph.txt");
}

struct FileFacts {
  const char* path;  // under pipedream-profiles/
  std::size_t nodes;
  std::size_t edges;  // distinct edges
};

const FileFacts files[] = {
    {"profiler/image_classification/profiles/alexnet/graph.txt", 23, 23},
    {"profiler/image_classification/profiles/densenet121/graph.txt", 429, 487},
    {"profiler/image_classification/profiles/nasnetalarge/graph.txt", 1251, 1468},
    {"profiler/image_classification/profiles/nasnetamobile/graph.txt", 921, 1078},
    {"profiler/image_classification/profiles/resnet101/graph.txt", 347, 380},
    {"profiler/image_classification/profiles/resnet18/graph.txt", 71, 79},
    {"profiler/image_classification/profiles/resnet18/graph_copy.txt", 71, 79},
    {"profiler/image_classification/profiles/resnet50/graph.txt", 177, 193},
    {"profiler/image_classification/profiles/resnext101/graph.txt", 347, 380},
    {"profiler/image_classification/profiles/resnext50/graph.txt", 177, 193},
    {"profiler/image_classification/profiles/squeezenet1_0/graph.txt", 68, 76},
    {"profiler/image_classification/profiles/vgg16/graph.txt", 41, 41},
    {"profiler/translation/profiles/gnmt/graph.txt", 48, 58},
    {"graph/test_graphs/resnet50_partitioned.txt", 177, 193},
    {"graph/test_graphs/resnext50_generated.txt", 177, 193},
    {"graph/test_graphs/test.txt", 6, 6},
    {"graph/test_graphs/test2.txt", 5, 6},
    {"graph/test_graphs/vgg16_partitioned.txt", 41, 41},
};

TEST(PipeDreamProfiles, EveryFileParsesAndBuildsALayerGraph) {
  for (const FileFacts& facts : files) {
    const PipeDreamProfile profile = partrain::partition::read_pipedream_profile(data_path(facts.path));
    EXPECT_EQ(profile.nodes.size(), facts.nodes) << facts.path;
    EXPECT_EQ(profile.edges.size(), facts.edges) << facts.path;
    const std::vector<int> order = profile.topological_order();
    ASSERT_EQ(order.size(), facts.nodes) << facts.path;
    std::vector<int> position(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
    for (const auto& [from, to] : profile.edges) EXPECT_LT(position[from], position[to]) << facts.path;
    const partrain::Graph graph = partrain::partition::layer_chain_graph(profile);
    ASSERT_EQ(graph.tasks().size(), facts.nodes) << facts.path;
    for (std::size_t t = 0; t < order.size(); ++t) EXPECT_EQ(graph.task(static_cast<int>(t)).name, profile.nodes[order[t]].id);
  }
}

TEST(PipeDreamProfiles, NumbersMatchTheFile) {
  const PipeDreamProfile vgg = partrain::partition::read_pipedream_profile(profile_path("vgg16"));
  const int pool = vgg.find("node11");
  ASSERT_GE(pool, 0);
  EXPECT_EQ(vgg.nodes[pool].line, 1);
  EXPECT_EQ(vgg.nodes[pool].description, "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");
  EXPECT_DOUBLE_EQ(vgg.nodes[pool].forward_ms, 2.211);
  EXPECT_DOUBLE_EQ(vgg.nodes[pool].backward_ms, 2.788);
  EXPECT_DOUBLE_EQ(vgg.nodes[pool].activation_bytes, 205520896.0);
  EXPECT_DOUBLE_EQ(vgg.nodes[pool].parameter_bytes, 0.0);
  EXPECT_EQ(vgg.nodes[pool].stage_id, -1);
  const int linear = vgg.find("node35");
  ASSERT_GE(linear, 0);
  EXPECT_EQ(vgg.nodes[linear].line, 15);
  EXPECT_DOUBLE_EQ(vgg.nodes[linear].parameter_bytes, 411058176.0);
  EXPECT_EQ(vgg.nodes[vgg.topological_order().front()].id, "node1");  // the input

  const PipeDreamProfile gnmt = partrain::partition::read_pipedream_profile(profile_path("gnmt"));
  const int lstm = gnmt.find("node7");
  ASSERT_GE(lstm, 0);
  EXPECT_EQ(gnmt.nodes[lstm].line, 6);
  EXPECT_DOUBLE_EQ(gnmt.nodes[lstm].activation_bytes, 6291456.0 + 131072.0 + 131072.0);  // [a; b; c] summed
  EXPECT_DOUBLE_EQ(gnmt.nodes[lstm].forward_ms, 3.190);

  const PipeDreamProfile split = partrain::partition::read_pipedream_profile(data_path("graph/test_graphs/vgg16_partitioned.txt"));
  const int first = split.find("node11");
  ASSERT_GE(first, 0);
  EXPECT_EQ(split.nodes[first].stage_id, 0);
  EXPECT_DOUBLE_EQ(split.nodes[first].backward_ms, 2.856);
}

void expect_parse_error(const std::string& text, const std::string& expected) {
  std::istringstream input(text);
  try {
    partrain::partition::parse_pipedream_profile(input, "bad.txt");
    FAIL() << "expected an error containing '" << expected << "'";
  } catch (const partrain::Error& error) {
    EXPECT_NE(error.message().find(expected), std::string::npos) << error.message();
  }
}

TEST(PipeDreamProfiles, MalformedLinesNameFileAndLine) {
  const std::string good =
      "node1 -- Input -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size=3.0, parameter_size=4.0\n";
  expect_parse_error(good + "node2 -- ReLU -- forward_compute_time=abc, backward_compute_time=2.0, activation_size=3.0, "
                            "parameter_size=4.0\n",
                     "bad.txt:2: node node2: forward_compute_time 'abc'");
  expect_parse_error(good + "\nnode3 -- ReLU -- forward_compute_time=1, backward_compute_time=2.0, parameter_size=4.0\n",
                     "bad.txt:3: node node3 has no activation_size");
  expect_parse_error(good + "node4 -- ReLU\n", "bad.txt:2:");
  expect_parse_error(good + "\tnode1 -- node9\n", "bad.txt:2: edge to unknown node node9");
  expect_parse_error(good + good, "bad.txt:2: node node1 is defined twice");
  expect_parse_error(good + "node2 -- X -- forward_compute_time=1, backward_compute_time=2.0, activation_size=[1; x], "
                            "parameter_size=4.0\n",
                     "bad.txt:2: node node2: activation_size");
  EXPECT_THROW(partrain::partition::read_pipedream_profile(data_path("no/such/graph.txt")), partrain::Error);
}

TEST(PipeDreamProfiles, LayerCostModelScalesTheMeasurements) {
  const PipeDreamProfile vgg = partrain::partition::read_pipedream_profile(profile_path("vgg16"));
  DeviceSpec device;
  device.link_bandwidth = 1e9;
  device.network_bandwidth = 1e9;
  const auto cost = partrain::partition::make_layer_profile_cost_model(vgg, device, 128);
  const std::vector<int> order = vgg.topological_order();
  // The first two layers (Input, Conv2d) at batch 64: half the profiled minibatch.
  const std::vector<int> tasks = {0, 1};
  const auto& input = vgg.nodes[order[0]];
  const auto& conv = vgg.nodes[order[1]];
  ASSERT_EQ(conv.id, "node2");
  const partrain::profile::Measurement m = cost->measure(tasks, 64);
  EXPECT_DOUBLE_EQ(m.forward_seconds, (input.forward_ms * 1e-3 * 0.5) + (conv.forward_ms * 1e-3 * 0.5));
  EXPECT_DOUBLE_EQ(m.backward_seconds, (input.backward_ms * 1e-3 * 0.5) + (conv.backward_ms * 1e-3 * 0.5));
  EXPECT_DOUBLE_EQ(m.parameter_bytes, conv.parameter_bytes);
  EXPECT_DOUBLE_EQ(m.activation_bytes, (input.activation_bytes + conv.activation_bytes) * 0.5);
  EXPECT_DOUBLE_EQ(m.boundary_input_bytes, 0.0);
  EXPECT_DOUBLE_EQ(m.boundary_output_bytes, conv.activation_bytes * 0.5);
  EXPECT_DOUBLE_EQ(m.peak_bytes, m.activation_bytes + conv.activation_bytes * 0.5);
  const std::vector<int> second = {1};
  EXPECT_DOUBLE_EQ(cost->measure(second, 128).boundary_input_bytes, input.activation_bytes);
  EXPECT_THROW(cost->measure(std::vector<int>{1000}, 1), partrain::Error);
}

// ---------------------------------------------------------------------------------------------
// RaNNC's DP against a brute force on real layer costs
// ---------------------------------------------------------------------------------------------

// Least closed-form step over every pipeline size D (whole nodes dividing the world, or the world),
// microbatch count, stage count, split and replica assignment that fits memory; `simulated` gets
// that plan's simulated step time.
double brute_force(double& simulated, const partrain::Graph& graph, const std::vector<std::vector<int>>& blocks, const CostModel& cost,
                   const PlannerOptions& options) {
  const int k = static_cast<int>(blocks.size());
  const int world = options.world_size, per_node = cost.device().devices_per_node;
  std::vector<int> sizes;
  for (int n = 1; per_node * n <= world; ++n)
    if (world % (per_node * n) == 0) sizes.push_back(per_node * n);
  if (sizes.empty() || sizes.back() != world) sizes.push_back(world);
  double best = kInf;
  for (int devices : sizes) {
    const int copies = world / devices;
    for (int m = 1; m <= options.max_microbatches; m *= 2) {
      if (options.global_batch % (static_cast<std::int64_t>(copies) * m) != 0) continue;
      const std::int64_t microbatch = options.global_batch / (static_cast<std::int64_t>(copies) * m);
      for (int stages = 1; stages <= std::min(k, devices); ++stages) {
        std::vector<int> lengths, replicas;
        compositions(k, stages, lengths, [&] {
          compositions(devices, stages, replicas, [&] {
            if (*std::max_element(replicas.begin(), replicas.end()) > microbatch) return;
            Plan plan;
            plan.world_size = world;
            plan.pipeline_replicas = copies;
            plan.global_batch = options.global_batch;
            plan.microbatches = m;
            plan.schedule = options.schedule;
            int first = 0;
            for (int s = 0; s < stages; ++s) {
              PlanStage stage;
              for (int b = first; b < first + lengths[s]; ++b)
                stage.tasks.insert(stage.tasks.end(), blocks[b].begin(), blocks[b].end());
              stage.replicas = replicas[s];
              stage.summary = "s";
              plan.stages.push_back(std::move(stage));
              first += lengths[s];
            }
            partrain::partition::predict_plan(plan, graph, cost, options);
            if (partrain::partition::memory_excess_bytes(plan, cost, options) > 0) return;
            if (closed_form_step_seconds(plan) < best) {
              best = closed_form_step_seconds(plan);
              simulated = plan.predicted_step_seconds;
            }
          });
        });
      }
    }
  }
  return best;
}

struct ModelCase {
  const char* model;
  std::int64_t profiled_batch;
};

class RannCOnProfiles : public ::testing::TestWithParam<ModelCase> {};

TEST_P(RannCOnProfiles, DpMatchesBruteForce) {
  const ModelCase model = GetParam();
  const PipeDreamProfile profile = partrain::partition::read_pipedream_profile(profile_path(model.model));
  const partrain::Graph graph = partrain::partition::layer_chain_graph(profile);
  DeviceSpec device;
  device.memory_bytes = 16e9;  // PipeDream's optimizer defaults
  device.link_bandwidth = 1e9;
  device.network_bandwidth = 1e9;
  device.devices_per_node = 4;
  const auto cost = partrain::partition::make_layer_profile_cost_model(profile, device, model.profiled_batch);
  // 8 blocks of consecutive layers in topological order (convex: a range of a topological order).
  const int n = static_cast<int>(graph.tasks().size());
  const int k = 8;
  std::vector<std::vector<int>> blocks(k);
  for (int b = 0; b < k; ++b)
    for (int t = b * n / k; t < (b + 1) * n / k; ++t) blocks[b].push_back(t);
  for (int world : {4, 8}) {
    PlannerOptions options;
    options.world_size = world;
    options.global_batch = model.profiled_batch;
    options.memory_margin = 0.0;
    options.max_microbatches = 64;
    // The DP's model: recomputation at the stage boundaries (auto would let the final plan's
    // per-stage choice drop it where memory allows, which the DP does not price).
    options.recompute = "boundaries";
    double expected_simulated = kInf;
    const double expected = brute_force(expected_simulated, graph, blocks, *cost, options);
    const std::string what = std::string(model.model) + " on " + std::to_string(world) + " devices";
    ASSERT_TRUE(std::isfinite(expected)) << what << ": brute force found no plan";
    const Plan plan = partrain::partition::plan_stages_rannc(graph, blocks, *cost, options);
    // The closed form's optimum, or the printed Algorithm 1's split of the same configuration when
    // its simulated step is faster (stage_dp.h).
    if (std::fabs(closed_form_step_seconds(plan) - expected) > 1e-9 * expected)
      EXPECT_LT(plan.predicted_step_seconds, expected_simulated) << what << ": neither the closed form's optimum nor faster";
    EXPECT_LE(partrain::partition::memory_excess_bytes(plan, *cost, options), 0.0) << what;
    std::cout << what << ":\n" << partrain::format_plan_table(plan);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RannCOnProfiles,
                         ::testing::Values(ModelCase{"vgg16", 128}, ModelCase{"resnet50", 128}, ModelCase{"alexnet", 256}),
                         [](const ::testing::TestParamInfo<ModelCase>& info) { return std::string(info.param.model); });

}  // namespace
