// Unit tests of CAPSlog (capslog.txt §III): the profiling partitionings of §III-A (the paper's
// sequences and run counts, criteria C1–C3), the extraction of M_i / M_a (the predictor reproduces
// every measured GPU's peak), the predictor M_p, fill-first (Algorithm 2) from GPU 0, the binary
// search (Algorithm 1) against brute force over every contiguous split, and the planner's use of
// measured or analytic profiling peaks. References are independent: enumeration
// (testing::compositions), hand-worked examples, plain sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/model.h"
#include "partition/capslog/capslog.h"
#include "partition/capslog/capslog_profiling.h"
#include "partition/common/cost_model.h"
#include "partition/common/plan_builder.h"
#include "support/brute_force.h"
#include "support/errors.h"
#include "support/tiny_models.h"

namespace {

using namespace partrain;
using namespace partrain::partition;
using partrain::testing::error_message;

using Runs = std::vector<std::pair<std::vector<int>, std::vector<int>>>;

Runs as_pairs(const std::vector<CapslogProfilingRun>& runs) {
  Runs pairs;
  for (const CapslogProfilingRun& run : runs) pairs.emplace_back(run.layers_per_device, run.measured_devices);
  return pairs;
}

// M_p by its definition, as a plain sum.
double plain_prediction(const CapslogLayerMemory& memory, int first, int last) {
  double bytes = memory.isolated[first];
  for (int k = first + 1; k <= last; ++k) bytes += memory.added[k];
  return bytes;
}

// The smallest largest M_p over every split of the layers into `devices` non-empty contiguous parts.
double brute_force(const CapslogLayerMemory& memory, int devices) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> counts;
  partrain::testing::compositions(static_cast<int>(memory.size()), devices, counts, [&] {
    double largest = 0;
    int first = 0;
    for (int c : counts) {
      largest = std::max(largest, plain_prediction(memory, first, first + c - 1));
      first += c;
    }
    best = std::min(best, largest);
  });
  return best;
}

// Integer figures with M_a ≥ 0 and M_i(l + 1) ≤ M_i(l) + M_a(l + 1): a fixed per-GPU part (buffers,
// framework) plus each layer's own bytes, the shape that makes fill-first exact (capslog.h).
CapslogLayerMemory random_memory(std::mt19937_64& random, int layers) {
  std::uniform_int_distribution<int> own(0, 1000), fixed(0, 300), zero(0, 5);
  const double base = fixed(random);
  CapslogLayerMemory memory;
  for (int l = 0; l < layers; ++l) {
    const double bytes = zero(random) == 0 ? 0.0 : own(random);
    memory.isolated.push_back(base + bytes);
    memory.added.push_back(l == 0 ? 0.0 : bytes);
  }
  return memory;
}

// ---------------------------------------------------------------------------------------------
// §III-A: profiling partitionings
// ---------------------------------------------------------------------------------------------

TEST(CapslogProfiling, PaperSequencesForTenLayersOnFourGpus) {
  // M_i: [1,1,1,7] isolates layers 0..2 on GPUs 0..2; Z = 1 + (G − 2) = 3: [3,1,1,5] isolates 3, 4;
  // Z = 5: [5,1,1,3]; the final [7,1,1,1] isolates 7, 8, 9 on GPUs 1..3.
  // M_a: [2,2,2,4] (pairs {0,1}, {2,3}, {4,5}) and [1,2,2,5] ({1,2}, {3,4}); Z = 2 + 2(G − 2) = 6: the
  // final [6,2,2] ({6,7}, {8,9}) and [5,2,2,1] ({5,6}, {7,8}).
  const Runs expected{{{1, 1, 1, 7}, {0, 1, 2}}, {{3, 1, 1, 5}, {1, 2}}, {{5, 1, 1, 3}, {1, 2}},
                      {{7, 1, 1, 1}, {1, 2, 3}}, {{2, 2, 2, 4}, {0, 1, 2}}, {{1, 2, 2, 5}, {1, 2}},
                      {{6, 2, 2}, {1, 2}},       {{5, 2, 2, 1}, {1, 2}}};
  EXPECT_EQ(as_pairs(capslog_profiling_runs(10, 4)), expected);
}

TEST(CapslogProfiling, RunCountsOfThePaper) {
  // Fig. 12, |P| of CAPSlog on 8 GPUs: DETR with 24, 41 and 47 cut points (25, 42, 48 layers).
  EXPECT_EQ(capslog_profiling_runs(25, 8).size(), 8u);
  EXPECT_EQ(capslog_profiling_runs(42, 8).size(), 15u);
  EXPECT_EQ(capslog_profiling_runs(48, 8).size(), 16u);
}

TEST(CapslogProfiling, EveryLayerMeetsTheCriteria) {
  for (int devices = 1; devices <= 9; ++devices) {
    for (int layers = 1; layers <= 40; ++layers) {
      const std::vector<CapslogProfilingRun> runs = capslog_profiling_runs(layers, devices);
      std::set<int> isolated, together;  // C1: {l}; C2/C3 with n = 1: {l − 1, l}, by l
      std::set<std::vector<int>> seen;
      for (const CapslogProfilingRun& run : runs) {
        ASSERT_LE(static_cast<int>(run.layers_per_device.size()), std::max(devices, 3));
        EXPECT_TRUE(seen.insert(run.layers_per_device).second) << "duplicate run";
        std::vector<int> first{0};
        for (int c : run.layers_per_device) {
          ASSERT_GE(c, 1);
          first.push_back(first.back() + c);
        }
        ASSERT_EQ(first.back(), layers);
        ASSERT_FALSE(run.measured_devices.empty());
        for (int g : run.measured_devices) {
          ASSERT_LT(g, static_cast<int>(run.layers_per_device.size()));
          // Trimming: a measured GPU holds the layers of interest only, one or two.
          ASSERT_LE(run.layers_per_device[g], 2) << layers << "/" << devices;
          (run.layers_per_device[g] == 1 ? isolated : together).insert(first[g + 1] - 1);
        }
      }
      for (int l = 0; l < layers; ++l) {
        EXPECT_TRUE(isolated.count(l)) << "C1, layer " << l << " of " << layers << " on " << devices;
        if (l > 0) {
          EXPECT_TRUE(together.count(l)) << "C3, layer " << l << " of " << layers << " on " << devices;
        }
      }
    }
  }
  EXPECT_THROW(capslog_profiling_runs(0, 4), Error);
  EXPECT_THROW(capslog_profiling_runs(4, 0), Error);
}

// ---------------------------------------------------------------------------------------------
// §III-A: M_i and M_a from the measured peaks
// ---------------------------------------------------------------------------------------------

// A peak per measured GPU: a random integer per layer range (a range measured twice reads the same).
std::vector<std::vector<double>> random_peaks(const std::vector<CapslogProfilingRun>& runs, std::mt19937_64& random) {
  std::uniform_int_distribution<int> bytes(1, 1 << 20);
  std::map<std::pair<int, int>, double> of_range;
  std::vector<std::vector<double>> peaks;
  for (const CapslogProfilingRun& run : runs) {
    std::vector<double>& row = peaks.emplace_back(run.layers_per_device.size(), std::numeric_limits<double>::quiet_NaN());
    int first = 0;
    for (std::size_t g = 0; g < run.layers_per_device.size(); ++g) {
      const std::pair<int, int> range{first, first + run.layers_per_device[g] - 1};
      if (std::find(run.measured_devices.begin(), run.measured_devices.end(), static_cast<int>(g)) !=
          run.measured_devices.end())
        row[g] = of_range.try_emplace(range, bytes(random)).first->second;
      first += run.layers_per_device[g];
    }
  }
  return peaks;
}

TEST(CapslogSolve, PredictorReproducesEveryMeasuredPeak) {
  std::mt19937_64 random(17);
  for (int devices = 1; devices <= 8; ++devices) {
    for (int layers = 1; layers <= 30; ++layers) {
      const std::vector<CapslogProfilingRun> runs = capslog_profiling_runs(layers, devices);
      const std::vector<std::vector<double>> peaks = random_peaks(runs, random);
      const CapslogLayerMemory memory = capslog_solve_memory(layers, runs, peaks);
      ASSERT_EQ(static_cast<int>(memory.size()), layers);
      EXPECT_EQ(memory.added[0], 0.0);
      for (std::size_t r = 0; r < runs.size(); ++r) {
        int first = 0;
        for (std::size_t g = 0; g < runs[r].layers_per_device.size(); ++g) {
          const int last = first + runs[r].layers_per_device[g] - 1;
          if (std::find(runs[r].measured_devices.begin(), runs[r].measured_devices.end(), static_cast<int>(g)) !=
              runs[r].measured_devices.end()) {
            EXPECT_EQ(capslog_predict_memory(memory, first, last), peaks[r][g])
                << layers << " layers, " << devices << " GPUs, run " << r << " GPU " << g;
          }
          first = last + 1;
        }
      }
    }
  }
}

TEST(CapslogSolve, HandWorkedFigures) {
  // Three layers; singles 10, 20, 30 and pairs {0,1} = 25, {1,2} = 45: M_a(1) = 25 − 10 = 15,
  // M_a(2) = 45 − 20 = 25; M_p(0, 2) = 10 + 15 + 25 = 50.
  const std::vector<CapslogProfilingRun> runs{{{1, 1, 1}, {0, 1, 2}}, {{2, 1}, {0}}, {{1, 2}, {1}}};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const CapslogLayerMemory memory = capslog_solve_memory(3, runs, {{10, 20, 30}, {25, nan}, {nan, 45}});
  EXPECT_EQ(memory.isolated, (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(memory.added, (std::vector<double>{0, 15, 25}));
  EXPECT_DOUBLE_EQ(capslog_predict_memory(memory, 0, 2), 50);
  EXPECT_DOUBLE_EQ(capslog_predict_memory(memory, 1, 2), 45);
  EXPECT_DOUBLE_EQ(capslog_predict_memory(memory, 2, 2), 30);
  EXPECT_EQ(capslog_device_memory(memory, {1, 2}), (std::vector<double>{10, 45}));
  EXPECT_THROW(capslog_predict_memory(memory, 2, 1), Error);
  EXPECT_THROW(capslog_predict_memory(memory, 0, 3), Error);
  EXPECT_THROW(capslog_device_memory(memory, {1, 1}), Error);
}

TEST(CapslogSolve, Errors) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Layer 2 never alone (C1).
  EXPECT_NE(error_message([&] { capslog_solve_memory(3, {{{1, 1, 1}, {0, 1}}, {{2, 1}, {0}}, {{1, 2}, {1}}},
                                                     {{1, 2, nan}, {3, nan}, {nan, 4}}); })
                .find("layer 2 is never alone"),
            std::string::npos);
  // Layers 1 and 2 never together (C3).
  EXPECT_NE(error_message([&] { capslog_solve_memory(3, {{{1, 1, 1}, {0, 1, 2}}, {{2, 1}, {0}}}, {{1, 2, 3}, {3, nan}}); })
                .find("no M_a of layer 2"),
            std::string::npos);
  EXPECT_NE(error_message([&] { capslog_solve_memory(3, {{{1, 1}, {0}}}, {{1, 2}}); }).find("places 2 layers"),
            std::string::npos);
  EXPECT_THROW(capslog_solve_memory(3, {{{1, 1, 1}, {3}}}, {{1, 2, 3}}), Error);
  EXPECT_THROW(capslog_solve_memory(3, {{{1, 1, 1}, {0}}}, {{nan, 2, 3}}), Error);
  EXPECT_THROW(capslog_solve_memory(3, {{{1, 1, 1}, {0}}}, {}), Error);
}

// ---------------------------------------------------------------------------------------------
// §III-B: fill-first (Algorithm 2) and the binary search (Algorithm 1)
// ---------------------------------------------------------------------------------------------

TEST(CapslogFillFirst, FillsFromGpuZero) {
  // M_i = 10 each, M_a = 5 each: a GPU holding k layers predicts 10 + 5 (k − 1).
  const CapslogLayerMemory memory{{10, 10, 10, 10, 10, 10}, {0, 5, 5, 5, 5, 5}};
  // Threshold 20: GPU 0 takes layers 0..2 (20), GPU 1 takes 3..4, GPU 2 the rest.
  CapslogPlacement placement = capslog_fill_first(memory, 3, 20);
  EXPECT_EQ(placement.layers_per_device, (std::vector<int>{3, 2, 1}));
  EXPECT_EQ(placement.device_memory_bytes, (std::vector<double>{20, 15, 10}));
  EXPECT_EQ(placement.peak_bytes, 20);
  // A huge threshold: GPU 0 keeps one layer for each later GPU.
  EXPECT_EQ(capslog_fill_first(memory, 3, 1e9).layers_per_device, (std::vector<int>{4, 1, 1}));
  // A threshold below any layer: one layer on each GPU but the last, which takes the rest.
  placement = capslog_fill_first(memory, 3, 1);
  EXPECT_EQ(placement.layers_per_device, (std::vector<int>{1, 1, 4}));
  EXPECT_EQ(placement.peak_bytes, 25);
  EXPECT_EQ(capslog_fill_first(memory, 1, 0).layers_per_device, (std::vector<int>{6}));
  EXPECT_THROW(capslog_fill_first(memory, 7, 1e9), Error);
  EXPECT_THROW(capslog_fill_first(memory, 0, 1e9), Error);
  EXPECT_THROW(capslog_fill_first(CapslogLayerMemory{{1, 1}, {0}}, 1, 1e9), Error);
}

TEST(CapslogRecommend, MatchesBruteForceOnRandomInstances) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 random(seed);
    for (int devices = 1; devices <= 5; ++devices) {
      for (int layers = devices; layers <= 11; ++layers) {
        const CapslogLayerMemory memory = random_memory(random, layers);
        const double best = brute_force(memory, devices);
        const CapslogPartition partition = capslog_recommend(memory, devices, 1 << 20);
        ASSERT_TRUE(partition.fits);
        EXPECT_EQ(partition.max_memory_bytes, best) << "seed " << seed << " L " << layers << " G " << devices;
        ASSERT_EQ(static_cast<int>(partition.layers_per_device.size()), devices);
        EXPECT_EQ(partition.device_memory_bytes, capslog_device_memory(memory, partition.layers_per_device));
        EXPECT_LE(partition.budget_steps, 21);  // ⌈log2(2^20 + 1)⌉ thresholds
        // Below the optimum nothing fits: the answer says so and names what the best split needs.
        if (best >= 1) {
          const CapslogPartition tight = capslog_recommend(memory, devices, static_cast<std::uint64_t>(best) - 1);
          EXPECT_FALSE(tight.fits);
          EXPECT_EQ(tight.max_memory_bytes, best);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The planner: profiling peaks, measured or analytic
// ---------------------------------------------------------------------------------------------

ModelConfig tiny(const std::string& type, int layers) {
  ModelConfig config = partrain::testing::tiny_model_config(type);
  config.layers = layers;
  return config;
}

TEST(CapslogPlanner, AnalyticPeaksGiveTheBruteForceSplit) {
  const Graph graph = build_model(tiny("bert", 4));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const int layers = static_cast<int>(groups.size());
  for (int stages : {2, 3, 4}) {
    PlannerOptions options;
    options.world_size = stages;
    options.global_batch = 8;
    options.stages = stages;
    options.microbatches = 4;
    const Plan plan = plan_capslog(graph, *cost, options);
    ASSERT_EQ(static_cast<int>(plan.stages.size()), stages);
    EXPECT_NE(plan.cost_model.find("analytic peaks"), std::string::npos) << plan.cost_model;
    // The figures the planner solved, from the profiling GPUs' analytic peaks.
    const std::vector<CapslogProfilingRun> runs = capslog_profiling_runs(layers, stages);
    const CapslogPeaks peaks = capslog_profiling_peaks(graph, groups, runs, *cost, options, stages,
                                                       std::vector<int>(stages, 1));
    EXPECT_EQ(peaks.measured, 0);
    const CapslogLayerMemory memory = capslog_solve_memory(layers, runs, peaks.peaks);
    // The plan's stages are layer runs; their memory is M_p and the largest is the brute-force minimum.
    std::vector<int> counts;
    std::size_t group = 0;
    for (const PlanStage& stage : plan.stages) {
      const std::size_t first = group;
      while (group < groups.size() && join_groups(groups, first, group + 1) != stage.tasks) ++group;
      ASSERT_LT(group, groups.size()) << "stage is not a run of layers";
      counts.push_back(static_cast<int>(++group - first));
    }
    const std::vector<double> predicted = capslog_device_memory(memory, counts);
    double largest = 0;
    for (int s = 0; s < stages; ++s) {
      EXPECT_EQ(plan.stages[s].memory_bytes, predicted[s]);
      largest = std::max(largest, predicted[s]);
    }
    // Fill-first is exact when removing a stage's first layer never costs memory (capslog.h). The
    // analytic figures of different pipeline positions need not satisfy that (a layer measured alone
    // where more microbatches are in flight): then the search may stop above the optimum.
    bool exact = true;
    for (int l = 1; l < layers; ++l)
      exact = exact && memory.added[l] >= 0 && memory.isolated[l] <= memory.isolated[l - 1] + memory.added[l];
    const double best = brute_force(memory, stages);
    if (exact) {
      EXPECT_DOUBLE_EQ(largest, best) << stages << " stages";
    }
    EXPECT_GE(largest, best);
    EXPECT_EQ(capslog_fill_first(memory, stages, largest).layers_per_device, counts) << stages << " stages";
  }
}

TEST(CapslogRecommend, FillFirstMissesTheOptimumWhenALayerCostsMoreAlone) {
  // M_p({0}) = 1, M_p({0,1}) = 2, M_p({1,2}) = 2 but M_p({2}) = 5: layer 2 alone needs more than with
  // layer 1 before it. The best split is [1, 2] (peak 2); fill-first gives GPU 0 layer 1 whenever
  // 2 fits, leaving layer 2 alone (peak 5). The paper's monotonicity (M_a ≥ 0) holds; the condition
  // fill-first needs, M_i(l + 1) ≤ M_i(l) + M_a(l + 1), does not (capslog.h, validation/README.md).
  const CapslogLayerMemory memory{{1, 1, 5}, {0, 1, 1}};
  EXPECT_EQ(brute_force(memory, 2), 2);
  const CapslogPartition partition = capslog_recommend(memory, 2, 100);
  EXPECT_EQ(partition.layers_per_device, (std::vector<int>{2, 1}));
  EXPECT_EQ(partition.max_memory_bytes, 5);
}

TEST(CapslogPlanner, RequestsTrimmedJobsAndUsesTheirMeasuredPeaks) {
  const Graph graph = build_model(tiny("gpt", 3));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  CapslogMeasurements measurements;
  PlannerOptions options;
  options.world_size = 4;
  options.global_batch = 8;
  options.stages = 4;
  options.capslog_measurements = &measurements;
  const Plan first = plan_capslog(graph, *cost, options);
  EXPECT_NE(first.cost_model.find("analytic"), std::string::npos);
  const std::vector<CapslogProfilingJob> jobs = measurements.take_requests();
  const int layers = static_cast<int>(layer_groups(graph).size());
  std::size_t measured_gpus = 0;
  for (const CapslogProfilingRun& run : capslog_profiling_runs(layers, 4)) measured_gpus += run.measured_devices.size();
  std::set<std::string> keys;
  for (const CapslogProfilingJob& job : jobs) keys.insert(job.key);
  EXPECT_EQ(keys.size(), jobs.size());
  EXPECT_LE(jobs.size(), measured_gpus);
  EXPECT_GE(jobs.size(), static_cast<std::size_t>(2 * layers - 1));  // a single per layer, a pair per boundary
  for (const CapslogProfilingJob& job : jobs) {
    job.plan.validate(graph);
    EXPECT_EQ(job.key, capslog_job_key(job.plan, job.device));
    EXPECT_EQ(job.plan.microbatches, first.microbatches);  // the target's setup
    for (const PlanStage& stage : job.plan.stages) EXPECT_EQ(stage.replicas, 1);
  }
  // Measured peaks: each job's GPU priced at 1 MiB per task. The plan then says so, and its
  // memory is M_p of these figures.
  for (const CapslogProfilingJob& job : jobs)
    measurements.insert(job.key, static_cast<double>(job.plan.stages[job.device].tasks.size()) * (1 << 20));
  const Plan second = plan_capslog(graph, *cost, options);
  EXPECT_TRUE(measurements.take_requests().empty());
  EXPECT_NE(second.cost_model.find("trimmed profiling runs' measured peaks"), std::string::npos) << second.cost_model;
  for (const PlanStage& stage : second.stages) EXPECT_GT(stage.memory_bytes, 0);
  EXPECT_THROW(measurements.insert("x", -1), Error);
}

}  // namespace
