// Numerics against an independent reference (docs/validation.md §Golden files): the golden files in
// validation/golden/ were made by validation/golden/make_golden.py with the libraries' own models
// (transformers' BertForPreTraining and GPT2LMHeadModel, torchvision's ResNet) trained from partrain's
// initial parameters on partrain's batches. Here the real partrain program runs the same settings (the
// file's "overrides") in fp32 and must give every step's loss within 1e-5 relative, every parameter's
// step-1 gradient and every parameter and BatchNorm statistic after the last step within 1e-4
// relative L2 (see expect_tensors_match for the floor under tensors that are rounding noise). Once on one rank, and for GPT once more under a 2-stage x 2-replica manual plan on
// 4 ranks (GPT: every token has a label, so the per-piece mean loss is the whole batch's); and bf16
// against torch.autocast with a tolerance of bf16's error size (MixedPrecisionMatchesAutocast).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "graph/interpreter.h"
#include "io/batch_file.h"
#include "io/config.h"
#include "io/hdf5_file.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

constexpr double kLossTolerance = 1e-5, kTensorTolerance = 1e-4;

std::string golden_path(const std::string& model) {
  return std::string(PARTRAIN_SOURCE_DIR) + "/validation/golden/" + model + "-tiny.h5";
}

// The golden file's overrides ("section.key=value" lines) as --set options.
std::string golden_overrides(const io::Hdf5File& golden) {
  std::istringstream lines(golden.read_string_attribute("/", "overrides"));
  std::ostringstream options;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) options << " --set '" << line << "'";
  return options.str();
}

// Runs partrain on `ranks` ranks with the golden settings plus `extra`; returns its output directory.
std::string run_golden(const std::string& model, int ranks, const std::string& extra, const std::string& name) {
  const io::Hdf5File golden = io::Hdf5File::open_read(golden_path(model));
  const std::string directory = std::string(PARTRAIN_RUN_DIR) + "/" + name;
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  std::ostringstream arguments;
  arguments << "train " << PARTRAIN_SOURCE_DIR << "/configs/" << model << "-tiny.toml" << golden_overrides(golden)
            << " --set log.dir=" << directory
            << " --set log.save_parameters=true --set log.save_gradients=true --set log.save_initial=true"
            << " --set data.path=" << PARTRAIN_DATA_DIR
            << (model == "resnet" ? "/fashion_mnist.h5" : model == "bert-pos" ? "/pos.h5" : "/text.h5")
            << extra;
  const testing::PartrainRun run = testing::run_partrain(ranks, arguments.str(), directory + ".log");
  EXPECT_EQ(run.status, 0) << run.command << "\n" << run.log;
  // The samples must be the golden run's: data/prepared made elsewhere could differ.
  const io::Hdf5File initial = io::Hdf5File::open_read(directory + "/initial_parameters.h5");
  for (const std::string& name : golden.dataset_names("batch"))
    EXPECT_EQ(initial.read<float>("batch/" + name), golden.read<float>("batch/" + name))
        << "batch/" << name << ": " << PARTRAIN_DATA_DIR << " does not give the samples " << golden_path(model)
        << " was made from (remake the golden files with validation/golden/make_golden.py)";
  return directory;
}

// ||actual - expected|| / ||expected|| over the whole tensor (0 when both are zero).
double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0, reference = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    difference += std::pow(static_cast<double>(actual[i]) - expected[i], 2);
    reference += std::pow(static_cast<double>(expected[i]), 2);
  }
  if (reference == 0) return difference == 0 ? 0 : INFINITY;
  return std::sqrt(difference / reference);
}

double l2(const std::vector<float>& values) {
  double sum = 0;
  for (const float value : values) sum += static_cast<double>(value) * value;
  return std::sqrt(sum);
}

// Every tensor of golden group `group` against dataset `group`/<name> of `file`: ||actual - expected||
// within kTensorTolerance of max(||expected||, floor(expected)). The floor only matters for tensors
// that are themselves rounding noise: BERT's key bias, whose gradient is analytically zero (softmax
// ignores a constant added to all of a query's scores) and which AdamW then moves by noise alone.
void expect_tensors_match(const io::Hdf5File& golden, const std::string& group, const std::string& file,
                          const std::function<double(const std::vector<float>&)>& floor) {
  const io::Hdf5File actual = io::Hdf5File::open_read(file);
  const std::vector<std::string> names = golden.dataset_names(group);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(actual.dataset_names(group).size(), names.size()) << file;
  double worst = 0;
  std::string worst_name;
  for (const std::string& name : names) {
    const std::string dataset = group + "/" + name;
    ASSERT_TRUE(actual.has_dataset(dataset)) << file << " has no " << dataset;
    std::vector<std::int64_t> expected_shape, actual_shape;
    const std::vector<float> expected = golden.read<float>(dataset, &expected_shape);
    const std::vector<float> values = actual.read<float>(dataset, &actual_shape);
    ASSERT_EQ(actual_shape, expected_shape) << dataset;
    const double scale = std::max(l2(expected), floor(expected));
    const double error = scale == 0 ? relative_l2(values, expected) : relative_l2(values, expected) * l2(expected) / scale;
    EXPECT_LE(error, kTensorTolerance) << dataset << " of " << file << " (|expected| " << l2(expected) << ")";
    if (error > worst) worst = error, worst_name = name;
  }
  std::printf("%s: %zu tensors, largest relative L2 error %.3g (%s)\n", group.c_str(), names.size(), worst,
              worst_name.c_str());
}

void expect_matches_golden(const std::string& model, const std::string& directory) {
  const io::Hdf5File golden = io::Hdf5File::open_read(golden_path(model));
  const std::vector<float> expected = golden.read<float>("loss");
  const std::vector<double> losses = testing::metric_values(directory, "loss");
  ASSERT_EQ(losses.size(), expected.size()) << directory;
  for (std::size_t step = 0; step < expected.size(); ++step)
    EXPECT_NEAR(losses[step], expected[step], kLossTolerance * std::abs(expected[step])) << "step " << step + 1;
  // Gradients: at least 1e-6 of the global gradient norm (analytically zero gradients are noise).
  double global_norm = 0;
  for (const std::string& name : golden.dataset_names("grad")) global_norm += std::pow(l2(golden.read<float>("grad/" + name)), 2);
  global_norm = std::sqrt(global_norm);
  expect_tensors_match(golden, "grad", directory + "/gradients.h5", [&](const std::vector<float>&) { return 1e-6 * global_norm; });
  // Parameters after AdamW: at least lr per element, the size of one AdamW update (eps bounds what
  // a noise gradient moves, see make_golden.py). After SGD: no floor.
  const bool adamw = golden.read_string_attribute("/", "optimizer") == "adamw";
  const double lr = golden.read_double_attribute("/", "lr");
  expect_tensors_match(golden, "model", directory + "/parameters.h5", [&](const std::vector<float>& expected) {
    return adamw ? lr * std::sqrt(static_cast<double>(expected.size())) : 0.0;
  });
}

class GoldenFiles : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenFiles, SingleRankMatchesLibraryModel) {
  const std::string model = GetParam();
  expect_matches_golden(model, run_golden(model, 1, "", model + "-1rank"));
}

// bert-pos: BERT's sequence classification (configs/bert-pos-tiny.toml, BertForSequenceClassification).
INSTANTIATE_TEST_SUITE_P(Tiny, GoldenFiles, ::testing::Values("bert", "gpt", "resnet", "bert-pos"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');  // gtest names: no '-'
                           return name;
                         });

// Mixed precision against PyTorch's: partrain with [train] precision = "bf16" (bf16 compute, fp32
// masters) against the library model under torch.autocast(bfloat16) (the file's /bf16 group). The
// two round at different places (autocast: matmul/conv outputs; partrain: every op's output), so
// neither is the other's reference: each is fp32 plus a bf16-sized error. The tolerance is that
// error's size: max(one bf16 rounding, 2^-9 for losses and 2^-8 for the gradients' global relative
// L2; twice PyTorch's own bf16-vs-fp32 distance, which is the triangle inequality's bound when
// partrain's bf16 error is no larger than PyTorch's). ResNet's BatchNorm over 8 samples makes bf16
// drift far from fp32 in PyTorch too (4% in loss by step 3, ~40% in gradients): the band is wide.
double distance(const io::Hdf5File& file, const std::string& group, const io::Hdf5File& reference,
                const std::string& reference_group, double* reference_norm = nullptr) {
  double difference = 0, norm = 0;
  for (const std::string& name : reference.dataset_names(reference_group)) {
    const std::vector<float> a = file.read<float>(group + "/" + name), b = reference.read<float>(reference_group + "/" + name);
    for (std::size_t i = 0; i < b.size(); ++i) {
      difference += std::pow(static_cast<double>(a[i]) - b[i], 2);
      norm += static_cast<double>(b[i]) * b[i];
    }
  }
  if (reference_norm) *reference_norm = std::sqrt(norm);
  return std::sqrt(difference / norm);
}

// The run in `directory` against the golden file's mixed-precision group `group` ("bf16", "fp16"):
// every step's loss within max(`loss_floor`, twice PyTorch's own distance to fp32) relative, and the
// step-1 gradients (global relative L2) within max(`gradient_floor`, twice PyTorch's distance).
void expect_near_autocast(const io::Hdf5File& golden, const std::string& directory, const std::string& group,
                          double loss_floor, double gradient_floor) {
  const std::vector<float> fp32 = golden.read<float>("loss"), autocast = golden.read<float>(group + "/loss");
  const std::vector<double> losses = testing::metric_values(directory, "loss");
  ASSERT_EQ(losses.size(), autocast.size()) << directory;
  double pytorch_loss_error = 0;
  for (std::size_t step = 0; step < fp32.size(); ++step)
    pytorch_loss_error = std::max(pytorch_loss_error, std::abs(static_cast<double>(autocast[step]) - fp32[step]) / std::abs(fp32[step]));
  const double loss_tolerance = std::max(loss_floor, 2 * pytorch_loss_error);
  for (std::size_t step = 0; step < losses.size(); ++step)
    EXPECT_NEAR(losses[step], autocast[step], loss_tolerance * std::abs(autocast[step])) << "step " << step + 1;
  const double pytorch_gradient_error = distance(golden, group + "/grad", golden, "grad");
  const double gradient_tolerance = std::max(gradient_floor, 2 * pytorch_gradient_error);
  const double gradient_error = distance(io::Hdf5File::open_read(directory + "/gradients.h5"), "grad", golden, group + "/grad");
  EXPECT_LE(gradient_error, gradient_tolerance);
  std::printf("%s: loss tolerance %.3g relative; gradients: partrain vs autocast %.3g, autocast vs fp32 %.3g "
              "(tolerance %.3g)\n", group.c_str(), loss_tolerance, gradient_error, pytorch_gradient_error,
              gradient_tolerance);
}

TEST_P(GoldenFiles, MixedPrecisionMatchesAutocast) {
  const std::string model = GetParam();
  const std::string directory = run_golden(model, 1, " --set train.precision=bf16", model + "-bf16");
  expect_near_autocast(io::Hdf5File::open_read(golden_path(model)), directory, "bf16", std::ldexp(1.0, -9),
                       std::ldexp(1.0, -8));
}

// fp16 with dynamic loss scaling against PyTorch's: partrain with [train] precision = "fp16" against
// the library model under torch.autocast(float16) with torch.amp.GradScaler (the file's /fp16 group,
// validation/golden/make_golden.py --add-fp16). The tolerance is built as bf16's above with fp16's
// error size: fp16 keeps 10 mantissa bits (bf16 7), so one rounding is 2^-11 relative; the band is
// max(2^-11 for losses and 2^-10 for the gradients' global relative L2, twice PyTorch's own
// fp16-vs-fp32 distance). The loss scales and skipped flags follow the same state machine as
// GradScaler's and must equal its exactly; the gradients compared are the unscaled ones. partrain
// rounds every op's output to fp16 (autocast only the lowered ops'), so its distance to autocast is
// nearer the band than bf16's: measured (torch 2.15) gradients 5.0e-4 against 9.8e-4 for GPT and
// 8.2e-4 against 9.8e-4 for BERT; losses within 2e-6 (GPT) and 1e-5 (BERT) relative.
TEST_P(GoldenFiles, Fp16MatchesAutocastGradScaler) {
  const std::string model = GetParam();
  const io::Hdf5File golden = io::Hdf5File::open_read(golden_path(model));
  if (!golden.has_dataset("fp16/loss"))
    GTEST_SKIP() << golden_path(model) << " has no /fp16 group (add it with validation/golden/make_golden.py "
                 << "--add-fp16 " << model << ", which needs torch)";
  const std::string directory = run_golden(model, 1, " --set train.precision=fp16", model + "-fp16");
  const std::vector<float> scales = golden.read<float>("fp16/loss_scale");  // powers of 2: exact in float
  EXPECT_EQ(testing::metric_values(directory, "loss_scale"), std::vector<double>(scales.begin(), scales.end()));
  const std::vector<float> skipped = golden.read<float>("fp16/skipped");
  EXPECT_EQ(testing::metric_values(directory, "skipped"), std::vector<double>(skipped.begin(), skipped.end()));
  expect_near_autocast(golden, directory, "fp16", std::ldexp(1.0, -11), std::ldexp(1.0, -10));
}

// A pipeline (stages h.0 | h.1 + head) with two data-parallel replicas each, two microbatches.
// ---------------- step 1's logits ----------------
// The golden file's /logits/* are the library model's outputs of step 1 (train mode; dropout is 0 in
// its overrides): GPT's logits at every sample's first 8 positions, BERT's MLM logits at the
// labelled positions and its NSP logits, ResNet's logits. partrain's graph (built from the same
// overrides) runs the same forward on the CPU backend from its seeded initial parameters on step
// 1's batch (the golden /batch rows of the first global batch); every logit tensor must agree within
// 1e-5 relative L2 (fp32; only the summation order differs).

// Input `index` of the task named `task_name` (a loss task: 0 the logits, 1 the labels).
int task_input(const Graph& graph, const std::string& task_name, std::size_t index) {
  for (const Task& task : graph.tasks())
    if (task.name == task_name) return task.inputs.at(index);
  ADD_FAILURE() << "no task " << task_name;
  return -1;
}

// The rows of `tensor` ([N, ...] flattened to [N, row]) where `keep` holds, as one float vector.
std::vector<float> rows_where(const Tensor& tensor, const std::vector<bool>& keep) {
  const std::vector<float> values = tensor.to_float_vector();
  const std::size_t row = values.size() / keep.size();
  std::vector<float> result;
  for (std::size_t r = 0; r < keep.size(); ++r)
    if (keep[r]) result.insert(result.end(), values.begin() + r * row, values.begin() + (r + 1) * row);
  return result;
}

TEST_P(GoldenFiles, StepOneLogitsMatchLibraryModel) {
  const std::string model = GetParam();
  const io::Hdf5File golden = io::Hdf5File::open_read(golden_path(model));
  std::vector<std::string> overrides;
  std::istringstream lines(golden.read_string_attribute("/", "overrides"));
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) overrides.push_back(line);
  const ExperimentConfig config =
      load_experiment(std::string(PARTRAIN_SOURCE_DIR) + "/configs/" + model + "-tiny.toml", overrides);
  const Graph graph = build_model(config.model);
  TensorMap values;
  for (auto& [value, tensor] :
       initialize_parameters(graph, static_cast<std::uint64_t>(config.train.seed), config.model.initializer_range))
    values[value] = tensor;
  // Step 1's samples: the first global batch of the golden file's /batch (a batch file).
  const std::int64_t batch = config.train.global_batch;
  std::vector<io::BatchField> fields;
  std::vector<int> field_values;
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Input && value.kind != ValueKind::Label) continue;
    const Shape& shape = value.type.shape;
    io::BatchField field;
    field.name = value.name;
    field.sample_shape = Shape(shape.begin() + (has_batch_dim(shape) ? 1 : 0), shape.end());
    field.dtype = value.type.dtype;
    fields.push_back(field);
    field_values.push_back(value.id);
  }
  const io::NamedTensors samples = io::BatchFile(golden_path(model), fields).samples(0, batch);
  for (std::size_t i = 0; i < fields.size(); ++i) values[field_values[i]] = samples.at(fields[i].name);
  ExecutionOptions options;
  options.training = true;  // as the golden step (BatchNorm uses the batch's statistics)
  run_forward(graph, whole_graph(graph), values, cpu_backend(), options);

  const auto expect_close = [&](const std::vector<float>& actual, const std::string& name) {
    const std::vector<float> expected = golden.read<float>("logits/" + name);
    ASSERT_EQ(actual.size(), expected.size()) << name;
    const double error = relative_l2(actual, expected);
    std::printf("%s logits/%s: %zu values, relative L2 error %.3g\n", model.c_str(), name.c_str(), expected.size(), error);
    EXPECT_LE(error, kLossTolerance) << "logits/" << name << " of " << golden_path(model);
    // The check can fail: one logit off by 1e-4 of the tensor's norm is caught.
    std::vector<float> perturbed = actual;
    perturbed[perturbed.size() / 2] += static_cast<float>(1e-4 * l2(expected));
    EXPECT_GT(relative_l2(perturbed, expected), kLossTolerance) << "logits/" << name << ": a perturbed logit passes";
  };
  if (model == "gpt") {  // [B, S, V] -> the first 8 positions of every sample
    const Tensor logits = values.at(task_input(graph, "loss", 0));
    std::vector<bool> keep;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t position = 0; position < logits.dim(1); ++position) keep.push_back(position < 8);
    expect_close(rows_where(logits, keep), "logits_first8");
  } else if (model == "bert") {  // MLM logits where the label is not the ignore index; NSP logits
    const Tensor logits = values.at(task_input(graph, "cls.predictions.loss", 0));
    const Tensor labels = values.at(task_input(graph, "cls.predictions.loss", 1));
    std::vector<bool> keep;
    for (std::int64_t i = 0; i < labels.numel(); ++i) keep.push_back(labels.data<std::int64_t>()[i] != -100);
    expect_close(rows_where(logits, keep), "prediction_logits_labelled");
    expect_close(values.at(task_input(graph, "cls.seq_relationship.loss", 0)).to_float_vector(), "seq_relationship_logits");
  } else {
    expect_close(values.at(task_input(graph, "loss", 0)).to_float_vector(), "logits");
  }
}

TEST(GoldenPipeline, GptTwoStagesTwoReplicasMatchesLibraryModel) {
  const std::string directory =
      run_golden("gpt", 4,
                 " --set parallel.planner=manual --set parallel.stages=2 --set 'parallel.replicas=[2, 2]'"
                 " --set 'parallel.boundaries=[\"h.1\"]' --set train.microbatches=2",
                 "gpt-pipeline");
  expect_matches_golden("gpt", directory);
}

// BERT's sequence classification under other plans against the same golden file: a pipeline (the
// encoder's second layer, pooler and classifier on stage 2) with two data-parallel replicas per stage
// and two microbatches, and tensor parallelism t = 2 (Megatron's split of the encoder; the pooler and
// classifier replicated) in two data-parallel replicas. Every sample has its label, so each piece's
// mean loss averages to the batch's.
TEST(GoldenPipeline, BertClassificationTwoStagesTwoReplicasMatchesLibraryModel) {
  const std::string directory =
      run_golden("bert-pos", 4,
                 " --set parallel.planner=manual --set parallel.stages=2 --set 'parallel.replicas=[2, 2]'"
                 " --set 'parallel.boundaries=[\"encoder.layer.1\"]' --set train.microbatches=2",
                 "bert-pos-pipeline");
  expect_matches_golden("bert-pos", directory);
}

TEST(GoldenPipeline, BertClassificationTensorParallelMatchesLibraryModel) {
  const std::string directory =
      run_golden("bert-pos", 4,
                 " --set parallel.planner=manual --set parallel.stages=1 --set 'parallel.replicas=[2]'"
                 " --set parallel.tensor_parallel=2 --set train.microbatches=1",
                 "bert-pos-tensor-parallel");
  expect_matches_golden("bert-pos", directory);
}

}  // namespace
}  // namespace partrain
