// CAPSlog's evaluation claim on our CPU runs (capslog.txt §IV-B, Fig. 8: predicted vs measured peak
// memory per GPU): the capslog planner plans gpt-tiny and bert-tiny on 4 ranks as 4 pipeline stages,
// its profiling partitionings running as trimmed profiling runs on the ranks (§III-A); then the
// plan trains a few steps, and each stage's measured peak (the rank's allocator high-water mark net
// of what the process held before the stage was built: rank_peak_memory_bytes − rank_baseline_bytes
// in metrics.jsonl) is compared with CAPSlog's M_p for that stage (the plan's memory_bytes).
// The paper gives no number for its prediction error (only Fig. 8's bars for RN50-D-E6); the
// errors measured here are printed and must stay within each case's tolerance (validation/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "models/model.h"
#include "partition/common/cost_model.h"
#include "support/memory_prediction.h"
#include "support/partrain_runs.h"

namespace {

// One run: the model, [parallel] recompute, and the relative error |M_p − measured| / measured
// allowed per stage. With recomputation (the default with several stages) the in-flight microbatches
// keep only the stage inputs and the prediction is exact to the allocator's rounding on our runs; the
// bound leaves room for other thread counts and allocators. Without it our 1F1B keeps S − s
// microbatches' activations on stage s, while the paper's predictor has no position term and the
// final profiling partitionings run on fewer GPUs (a shallower pipeline, fewer in flight): gpt-tiny's
// stage 1 comes out 15.6% low (validation/README.md), hence the looser bound.
struct PredictionCase {
  std::string model;
  std::string recompute;
  double tolerance;
};

using partrain::testing::passing_measured_range;
using partrain::testing::within_prediction;

std::string case_name(const ::testing::TestParamInfo<PredictionCase>& info) {
  return info.param.model + "_recompute_" + info.param.recompute;
}

// The check can fail (as golden_logits shows for the logits): on this stage's real numbers, a
// measured peak 0.1% beyond either end of the accepted range fails and 0.1% inside passes, and so does
// a prediction moved just past what the measured peak allows — the allowance is the stated one, no
// looser.
void expect_check_is_tight(double predicted, double measured, double tolerance, double sent_output_bytes, int stage) {
  constexpr double kBeyond = 1e-3;
  double error = 0;
  const auto [lowest, highest] = passing_measured_range(predicted, tolerance, sent_output_bytes);
  EXPECT_FALSE(within_prediction(predicted, lowest * (1 - kBeyond), tolerance, sent_output_bytes, error))
      << "stage " << stage << ": a measured peak below the allowance passes";
  EXPECT_FALSE(within_prediction(predicted, highest * (1 + kBeyond), tolerance, sent_output_bytes, error))
      << "stage " << stage << ": a measured peak above the allowance passes";
  EXPECT_TRUE(within_prediction(predicted, lowest * (1 + kBeyond), tolerance, sent_output_bytes, error))
      << "stage " << stage << ": a measured peak just inside the allowance fails";
  EXPECT_TRUE(within_prediction(predicted, highest * (1 - kBeyond), tolerance, sent_output_bytes, error))
      << "stage " << stage << ": a measured peak just inside the allowance fails";
  // The prediction perturbed: above the measured peak by more than the tolerance, or below it by
  // more than the tolerance and one sent output.
  EXPECT_FALSE(within_prediction(measured * (1 + tolerance) * (1 + kBeyond), measured, tolerance, sent_output_bytes, error))
      << "stage " << stage << ": a prediction above the allowance passes";
  const double lowest_prediction = measured * (1 - tolerance) - sent_output_bytes;
  if (lowest_prediction > 0) {
    EXPECT_FALSE(within_prediction(lowest_prediction * (1 - kBeyond), measured, tolerance, sent_output_bytes, error))
        << "stage " << stage << ": a prediction below the allowance passes";
  }
}

class CapslogMemoryPrediction : public ::testing::TestWithParam<PredictionCase> {};

TEST_P(CapslogMemoryPrediction, MeasuredStagePeaksMatchThePrediction) {
  const std::string model = GetParam().model;
  const double tolerance = GetParam().tolerance;
  const std::string directory = std::string(PARTRAIN_RUN_DIR) + "/" + model + "-" + GetParam().recompute + "-" +
                                std::to_string(::getpid());
  std::filesystem::remove_all(directory);
  std::ostringstream arguments;
  arguments << "train " << PARTRAIN_SOURCE_DIR << "/configs/" << model << "-tiny.toml"
            << " --set parallel.planner=capslog --set parallel.stages=4 --set train.steps=3"
            << " --set train.global_batch=8 --set model.seq_len=32 --set checkpoint.every=0"
            << " --set log.dir=" << directory << " --set profile.cache_dir=" << directory << "/profiles"
            << " --set parallel.recompute=" << GetParam().recompute
            << " --set data.path=" << PARTRAIN_DATA_DIR << "/text.h5";
  const partrain::testing::PartrainRun run = partrain::testing::run_partrain(4, arguments.str(), directory + ".log");
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
  // The profiling partitionings ran on the ranks (a fresh cache: nothing could be reused).
  EXPECT_NE(run.log.find("trimmed profiling GPUs on 4 ranks"), std::string::npos) << run.log;

  const nlohmann::json plan = nlohmann::json::parse(std::ifstream(directory + "/plan.json"));
  EXPECT_EQ(plan.at("planner").get<std::string>(), "capslog");
  EXPECT_NE(plan.at("cost_model").get<std::string>().find("trimmed profiling runs' measured peaks"), std::string::npos)
      << plan.at("cost_model");
  const nlohmann::json& stages = plan.at("stages");
  ASSERT_EQ(stages.size(), 4u);

  int steps = 0;
  const std::vector<double> measured = partrain::testing::measured_rank_peaks(directory, steps);
  ASSERT_EQ(measured.size(), 4u);
  ASSERT_EQ(steps, 3);
  double largest_error = 0, predicted_max = 0, measured_max = 0;
  std::printf("%s, recompute %s, capslog on 4 stages: stage, predicted MiB, measured MiB, error\n", model.c_str(),
              GetParam().recompute.c_str());
  // A stage releases a tensor it sent (an activation forward, an input gradient backward) once MPI
  // reports the send complete, which for a large message waits for the receiver to post its receive:
  // on a loaded machine the next pass may allocate before that, one such tensor above the prediction
  // (the trimmed runs' stand-in sends complete at once). So each stage may exceed its prediction by
  // its own largest boundary tensor at one microbatch, no more.
  const std::vector<std::string> sequence = {"model.seq_len=32"};
  const partrain::ExperimentConfig config =
      partrain::load_experiment(std::string(PARTRAIN_SOURCE_DIR) + "/configs/" + model + "-tiny.toml", sequence);
  const partrain::Graph graph = partrain::build_model(config.model);
  const auto microbatch = static_cast<std::int64_t>(8 / plan.at("microbatches").get<int>());
  for (int s = 0; s < 4; ++s) {  // one replica per stage: rank s holds stage s
    const double predicted = stages[s].at("memory_bytes").get<double>();
    const double sent_output_bytes =
        partrain::testing::largest_boundary_bytes(graph, stages[s].at("tasks").get<std::vector<int>>(), microbatch);
    ASSERT_GT(measured[s], 0);
    // Within the tolerance of the prediction, or above it by no more than one sent output.
    if (measured[s] > predicted * (1 + tolerance) && measured[s] <= predicted * (1 + tolerance) + sent_output_bytes)
      std::printf("  stage %d: %.3f MiB above the prediction, a sent output still in flight (at most %.3f MiB)\n", s,
                  (measured[s] - predicted) / (1 << 20), sent_output_bytes / (1 << 20));
    double error = 0;
    EXPECT_TRUE(within_prediction(predicted, measured[s], tolerance, sent_output_bytes, error)) << "stage " << s;
    std::printf("  %d  %8.3f  %8.3f  %+6.2f%%  (%s)\n", s, predicted / (1 << 20), measured[s] / (1 << 20), 100 * error,
                stages[s].at("summary").get<std::string>().c_str());
    largest_error = std::max(largest_error, std::abs(error));
    predicted_max = std::max(predicted_max, predicted);
    measured_max = std::max(measured_max, measured[s]);
    EXPECT_LE(std::abs(error), tolerance) << "stage " << s;
    expect_check_is_tight(predicted, measured[s], tolerance, sent_output_bytes, s);
  }
  std::printf("  largest per-stage error %.2f%%; overall peak predicted %.3f MiB, measured %.3f MiB (%+.2f%%)\n",
              100 * largest_error, predicted_max / (1 << 20), measured_max / (1 << 20),
              100 * (predicted_max - measured_max) / measured_max);
  // The peaks are cached with the layer profiles: a second run on the same cache measures nothing
  // and plans the same stages from the cached measurements.
  if (GetParam().model == "gpt" && GetParam().recompute == "auto") {
    const std::string again = directory + "/again";
    std::string second = arguments.str();
    second.replace(second.find(" --set log.dir=" + directory), std::string(" --set log.dir=" + directory).size(),
                   " --set log.dir=" + again);
    const partrain::testing::PartrainRun rerun = partrain::testing::run_partrain(4, second, again + ".log");
    ASSERT_EQ(rerun.status, 0) << rerun.command << "\n" << rerun.log;
    EXPECT_EQ(rerun.log.find("trimmed profiling GPUs on 4 ranks"), std::string::npos) << rerun.log;
    const nlohmann::json cached = nlohmann::json::parse(std::ifstream(again + "/plan.json"));
    EXPECT_NE(cached.at("cost_model").get<std::string>().find("trimmed profiling runs' measured peaks"), std::string::npos);
    for (int s = 0; s < 4; ++s) EXPECT_EQ(cached.at("stages")[s].at("tasks"), stages[s].at("tasks")) << "stage " << s;
  }
  if (!HasFailure()) std::filesystem::remove_all(directory);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CapslogMemoryPrediction,
                         ::testing::Values(PredictionCase{"gpt", "auto", 0.02}, PredictionCase{"bert", "auto", 0.02},
                                           PredictionCase{"gpt", "none", 0.20}),
                         case_name);

}  // namespace
