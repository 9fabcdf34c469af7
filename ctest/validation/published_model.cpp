// A published model imported into partrain against the library that published it (issue 28, item
// 2; docs/published-models.md §Checking the import): ctest/validation/check_published_minilm.py
// imports all-MiniLM-L6-v2 with validation/import_hf.py, tokenises sentences with its own tokenizer
// and writes what transformers' BertModel computes on them (eval mode, fp32) into a reference file:
//   /batch/<input or label>   the samples as partrain's BERT graph takes them
//   /last_hidden_state        f32 [B, S, H]
//   /pooler_output            f32 [B, H]
//   attributes "config", "checkpoint": the experiment file and checkpoint import_hf.py wrote.
// Here partrain builds the graph from that config, takes every parameter from the checkpoint, runs
// the forward on the CPU backend in evaluation mode, and the output of the last encoder layer's
// LayerNorm (and the pooler's tanh) must agree within 1e-5: relative L2 over the whole tensor and
// over every token's hidden vector. Skipped without the reference (PARTRAIN_PUBLISHED_REFERENCE).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "graph/interpreter.h"
#include "graph/subgraph.h"
#include "io/batch_file.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/hdf5_file.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"

namespace partrain {
namespace {

constexpr double kTolerance = 1e-5;

// The output of the task named `name`.
int task_output(const Graph& graph, const std::string& name) {
  for (const Task& task : graph.tasks())
    if (task.name == name) return task.outputs.at(0);
  ADD_FAILURE() << "no task " << name;
  return -1;
}

// ||a - b|| / ||b|| over [offset, offset + count).
double relative_l2(const std::vector<float>& a, const std::vector<float>& b, std::size_t offset, std::size_t count) {
  double difference = 0, norm = 0;
  for (std::size_t i = offset; i < offset + count; ++i) {
    difference += std::pow(static_cast<double>(a[i]) - b[i], 2);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm == 0 ? (difference == 0 ? 0 : INFINITY) : std::sqrt(difference / norm);
}

// Whole-tensor relative L2 and the largest per-row one (rows of `row` values); fails beyond 1e-5.
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, std::size_t row,
                  const std::string& name) {
  ASSERT_EQ(actual.size(), expected.size()) << name;
  const double whole = relative_l2(actual, expected, 0, expected.size());
  double worst_row = 0;
  for (std::size_t offset = 0; offset < expected.size(); offset += row)
    worst_row = std::max(worst_row, relative_l2(actual, expected, offset, row));
  std::printf("%s: %zu values, relative L2 error %.3g (largest over one token's vector %.3g)\n", name.c_str(),
              expected.size(), whole, worst_row);
  EXPECT_LE(whole, kTolerance) << name;
  EXPECT_LE(worst_row, kTolerance) << name;
  // The check can fail: one value moved by 1e-4 of its row's norm is caught.
  std::vector<float> perturbed = actual;
  double row_norm = 0;
  for (std::size_t i = 0; i < row; ++i) row_norm += static_cast<double>(expected[i]) * expected[i];
  perturbed[row / 2] += static_cast<float>(1e-4 * std::sqrt(row_norm));
  double perturbed_row = relative_l2(perturbed, expected, 0, row);
  EXPECT_GT(perturbed_row, kTolerance) << name << ": a perturbed value passes";
}

TEST(PublishedModel, HiddenStatesMatchTheLibrary) {
  const char* reference_path = std::getenv("PARTRAIN_PUBLISHED_REFERENCE");
  if (!reference_path) GTEST_SKIP() << "PARTRAIN_PUBLISHED_REFERENCE not set (ctest/validation/check_published_minilm.py sets it)";
  const io::Hdf5File reference = io::Hdf5File::open_read(reference_path);
  const std::string config_path = reference.read_string_attribute("/", "config");
  const ExperimentConfig config = load_experiment(config_path);
  ASSERT_EQ(config.model.type, "bert");
  const Graph graph = build_model(config.model);

  // Every parameter (and buffer) from the imported checkpoint, none left at partrain's initialisation.
  const io::Checkpoint checkpoint = io::read_checkpoint(reference.read_string_attribute("/", "checkpoint"));
  TensorMap values;
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Param && value.kind != ValueKind::Buffer) continue;
    const auto found = checkpoint.tensors.find("model/" + value.name);
    ASSERT_NE(found, checkpoint.tensors.end()) << checkpoint.path << " has no model/" << value.name;
    ASSERT_EQ(found->second.shape(), value.type.shape) << value.name;
    values[value.id] = found->second;
  }

  std::vector<io::BatchField> fields;
  std::vector<int> field_values;
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Input && value.kind != ValueKind::Label) continue;
    io::BatchField field;
    field.name = value.name;
    field.sample_shape = Shape(value.type.shape.begin() + (has_batch_dim(value.type.shape) ? 1 : 0), value.type.shape.end());
    field.dtype = value.type.dtype;
    fields.push_back(field);
    field_values.push_back(value.id);
  }
  const io::BatchFile batches(reference_path, fields);
  const io::NamedTensors samples = batches.samples(0, batches.samples_per_epoch());
  for (std::size_t i = 0; i < fields.size(); ++i) values[field_values[i]] = samples.at(fields[i].name);

  ExecutionOptions options;
  options.training = false;  // evaluation: no dropout, as the library model in eval()
  run_forward(graph, whole_graph(graph), values, cpu_backend(), options);

  const std::string last_layer = "bert.encoder.layer." + std::to_string(config.model.layers - 1) + ".output.LayerNorm";
  const std::size_t hidden = static_cast<std::size_t>(config.model.hidden);
  expect_close(values.at(task_output(graph, last_layer)).to_float_vector(), reference.read<float>("last_hidden_state"),
               hidden, "last_hidden_state");
  if (config.model.nsp)
    expect_close(values.at(task_output(graph, "bert.pooler.activation")).to_float_vector(),
                 reference.read<float>("pooler_output"), hidden, "pooler_output");
}

}  // namespace
}  // namespace partrain
