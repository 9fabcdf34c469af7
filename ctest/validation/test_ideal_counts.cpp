// Validation of the ideal counts against Table 1 of Tarnawski et al., "Efficient Algorithms for
// Device Placement of DNN Graph Operators" (NeurIPS 2020), column "Ideals" (the ideals of the
// forward part of each DNN): the DP's simplified class graph (src/partition/tarnawski/class_simplification.h)
// must have exactly the published number of ideals on every workload of ctest/data/dnn-partitioning
// that the table lists, and contracting trivial classes must keep the optimum: the DP's optimum
// equals that of the DP on the same classes without that step, computed in the same run, with and
// without CPUs. (Fusing cycles cannot change any optimum: every ideal holds a whole cycle or none.)
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "core/error.h"
#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/workload.h"

namespace {

using partrain::partition::ClassGraph;
using partrain::partition::PartitionOptions;

std::string workload_path(const std::string& relative) {
  return std::string(PARTRAIN_TEST_DATA) + "/dnn-partitioning/throughput-inputs/" + relative;
}

struct Row {
  const char* file;
  std::size_t published_ideals;  // Table 1, "Ideals"
};

const Row rows[] = {
    {"OperatorGraphs/bert_l-3_inference.json", 1428},   // BERT-3, operator inference
    {"OperatorGraphs/bert_l-12_inference.json", 2906},  // BERT-12, operator inference
    {"OperatorGraphs/bert_l-3_training.json", 2774},    // BERT-3, operator training
    {"LayerGraphs/bert24_inference.json", 30},          // BERT-24, layer inference
    {"LayerGraphs/resnet50_inference.json", 242},       // ResNet50, layer inference
    {"LayerGraphs/bert24_training.json", 30},           // BERT-24, layer training
    {"LayerGraphs/resnet50_training.json", 242},        // ResNet50, layer training
};

// The DP over every ideal of the classes without trivial-class contraction.
double uncontracted_optimum(const partrain::partition::Workload& workload, const PartitionOptions& options) {
  partrain::partition::ClassGraphOptions graph_options;
  graph_options.simplify = true;
  graph_options.contract_trivial = false;
  graph_options.accelerator_memory_bytes =
      options.accelerator_memory_bytes >= 0 ? options.accelerator_memory_bytes : workload.accelerator_memory_bytes;
  const ClassGraph graph(workload, graph_options);
  const auto family = partrain::partition::enumerate_ideals(graph, options.max_ideals, workload.source);
  return partrain::partition::partition_over_ideals(workload, graph, family, options).max_load_ms;
}

class IdealCounts : public ::testing::TestWithParam<Row> {};

TEST_P(IdealCounts, EqualTable1AndKeepTheOptimum) {
  const Row& row = GetParam();
  const auto workload = partrain::partition::read_workload(workload_path(row.file));
  const ClassGraph graph = partrain::partition::dp_class_graph(workload, PartitionOptions{});
  EXPECT_EQ(partrain::partition::enumerate_ideals(graph, 1000000, workload.source).size(), row.published_ideals)
      << row.file << ": " << graph.colour_class_count << " colour classes, " << graph.fused_class_count << " fused, "
      << graph.contracted_class_count << " contracted";
  for (int cpus : {workload.cpus, 0}) {
    PartitionOptions options;
    options.cpus = cpus;
    const auto result = partrain::partition::partition_ideals(workload, options);
    EXPECT_EQ(result.ideal_count, row.published_ideals) << row.file;
    EXPECT_NEAR(result.max_load_ms, uncontracted_optimum(workload, options), 1e-9) << row.file << " with " << cpus << " CPUs";
  }
}

INSTANTIATE_TEST_SUITE_P(DnnPartitioning, IdealCounts, ::testing::ValuesIn(rows),
                         [](const ::testing::TestParamInfo<Row>& info) {
                           std::string name = info.param.file;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// With memory that can bind (1 GiB for the 3.4 GiB of BERT-24 training), the sized trivial classes
// stay apart (more ideals than published) and the optimum is still that without contraction.
TEST(IdealCountsMemory, Bert24TrainingWithBindingMemoryKeepsTheOptimum) {
  const auto workload = partrain::partition::read_workload(workload_path("LayerGraphs/bert24_training.json"));
  PartitionOptions options;
  options.accelerator_memory_bytes = 1024.0 * 1024.0 * 1024.0;
  const auto result = partrain::partition::partition_ideals(workload, options);
  EXPECT_GT(result.ideal_count, 30u);
  EXPECT_NEAR(result.max_load_ms, uncontracted_optimum(workload, options), 1e-9);
}

}  // namespace
