// Validation against Table 1 of Tarnawski et al., "Efficient Algorithms for Device Placement of DNN
// Graph Operators" (NeurIPS 2020): the ideal DP must reproduce the published optimal maximum loads
// of the msr-fiddle/dnn-partitioning workloads (ctest/data/dnn-partitioning/EXPECTED.md), and DPL
// must never beat it while staying within a few percent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/units.h"
#include "partition/tarnawski/dpl.h"
#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/workload.h"

namespace {

using partrain::partition::PartitionOptions;

std::string workload_path(const std::string& relative) {
  return std::string(PARTRAIN_TEST_DATA) + "/dnn-partitioning/throughput-inputs/" + relative;
}

// EXPECTED.md prints 2 decimals: match within half a unit of the last digit.
void expect_published(double value, double published, const std::string& what) {
  EXPECT_LE(std::fabs(value - published), 0.005 + 1e-9) << what << ": got " << value << ", published " << published;
}

struct Row {
  const char* file;
  int accelerators;
  int cpus;
  double published;      // with the file's CPU count
  double without_cpus;   // l = 0
};

const Row rows[] = {
    {"OperatorGraphs/bert_l-3_training.json", 3, 1, 65.30, 65.30},
    {"OperatorGraphs/bert_l-3_inference.json", 3, 1, 27.92, 27.92},
    {"OperatorGraphs/bert_l-12_inference.json", 6, 1, 147.48, 147.48},
    {"LayerGraphs/bert24_training.json", 6, 1, 41.75, 41.75},
    {"LayerGraphs/bert24_inference.json", 6, 1, 17.79, 17.79},
    {"LayerGraphs/resnet50_training.json", 6, 1, 78.63, 80.45},
    {"LayerGraphs/resnet50_inference.json", 6, 1, 33.77, 34.22},
};

class Table1 : public ::testing::TestWithParam<Row> {};

TEST_P(Table1, IdealDpMatchesPublishedValueAndDplIsCloseButNeverBetter) {
  const Row& row = GetParam();
  const auto workload = partrain::partition::read_workload(workload_path(row.file));
  ASSERT_EQ(workload.accelerators, row.accelerators);
  ASSERT_EQ(workload.cpus, row.cpus);
  for (int cpus : {row.cpus, 0}) {
    PartitionOptions options;
    options.cpus = cpus;
    const auto optimal = partrain::partition::partition_ideals(workload, options);
    const auto linearised = partrain::partition::partition_linearised(workload, options);
    const std::string what = std::string(row.file) + " with " + std::to_string(cpus) + " CPUs";
    expect_published(optimal.max_load_ms, cpus == row.cpus ? row.published : row.without_cpus, what);
    EXPECT_GE(linearised.max_load_ms, optimal.max_load_ms - 1e-9) << what;
    EXPECT_LE(linearised.max_load_ms, optimal.max_load_ms * 1.03) << what;
    // The reconstructed split: every node once, loads within the maximum, device counts respected.
    std::vector<int> seen(workload.nodes.size(), 0);
    double worst = 0.0;
    int accelerators_used = 0, cpus_used = 0;
    for (const auto& device : optimal.devices) {
      for (std::size_t node : device.nodes) ++seen[node];
      worst = std::max(worst, device.load_ms);
      (device.accelerator ? accelerators_used : cpus_used)++;
      if (device.accelerator) {
        EXPECT_LE(device.size_bytes, workload.accelerator_memory_bytes);
      }
    }
    for (std::size_t node = 0; node < seen.size(); ++node) EXPECT_EQ(seen[node], 1) << what << " node " << node;
    EXPECT_NEAR(worst, optimal.max_load_ms, 1e-6) << what;
    EXPECT_LE(accelerators_used, row.accelerators);
    EXPECT_LE(cpus_used, cpus);
  }
}

INSTANTIATE_TEST_SUITE_P(DnnPartitioning, Table1, ::testing::ValuesIn(rows),
                         [](const ::testing::TestParamInfo<Row>& info) {
                           std::string name = info.param.file;
                           for (char& character : name)
                             if (!std::isalnum(static_cast<unsigned char>(character))) character = '_';
                           return name;
                         });

TEST(DnnPartitioningMemory, ResNet50TrainingWithMemoryLimits) {
  const auto workload = partrain::partition::read_workload(workload_path("LayerGraphs/resnet50_training.json"));
  struct Limited {
    const char* memory;
    double with_cpu;     // l = 1
    double without_cpu;  // l = 0; negative: infeasible
  };
  for (const Limited& limited : {Limited{"8GiB", 80.45, 82.50}, Limited{"7GiB", 82.50, 87.33}, Limited{"6GiB", 113.78, -1.0}}) {
    PartitionOptions options;
    options.accelerator_memory_bytes = static_cast<double>(partrain::parse_memory_size(limited.memory));
    options.cpus = 1;
    const auto with_cpu = partrain::partition::partition_ideals(workload, options);
    expect_published(with_cpu.max_load_ms, limited.with_cpu, std::string(limited.memory) + " l=1");
    EXPECT_GE(partrain::partition::partition_linearised(workload, options).max_load_ms, with_cpu.max_load_ms - 1e-9);
    options.cpus = 0;
    if (limited.without_cpu < 0) {
      try {
        partrain::partition::partition_ideals(workload, options);
        ADD_FAILURE() << limited.memory << " l=0 should be infeasible";
      } catch (const partrain::Error& error) {
        EXPECT_NE(error.message().find("no feasible split with 6 accelerators"), std::string::npos) << error.message();
      }
      EXPECT_THROW(partrain::partition::partition_linearised(workload, options), partrain::Error);
    } else {
      const auto without_cpu = partrain::partition::partition_ideals(workload, options);
      expect_published(without_cpu.max_load_ms, limited.without_cpu, std::string(limited.memory) + " l=0");
      EXPECT_GE(partrain::partition::partition_linearised(workload, options).max_load_ms,
                without_cpu.max_load_ms - 1e-9);
    }
  }
}

}  // namespace
