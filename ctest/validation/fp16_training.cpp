// fp16 mixed precision with dynamic loss scaling end to end (issue 28 item 4), the real program on
// the prepared data under mpiexec:
//  - fp16 tracks fp32 on gpt-tiny, and 4 ranks (2 stages x 2 replicas) in fp16 track one rank in
//    fp16 within the tolerances the bf16 test uses (distributed_training.cpp, MixedPrecision);
//  - an overflow forced into one rank's gradients at step N (PARTRAIN_FAULT_INJECT=
//    gradient_overflow:RANK:N) skips step N on every rank: the checkpoints after steps N-1 and N
//    hold bitwise the same parameters and optimizer state, the scale halves, training goes on;
//  - a resume restores the loss scale and its good-step count (the resumed steps' scales and losses
//    are bitwise the uninterrupted run's), and an fp32 run's checkpoint resumes under fp16.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/fault_injection.h"
#include "io/hdf5_file.h"
#include "support/partrain_jobs.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

const std::string kRoot = PARTRAIN_RUN_DIR;

// partrain train on gpt-tiny (seq_len 32, global batch 8) with `settings`, `ranks` ranks, the given
// environment (exported to every rank); returns the run directory.
std::string run_gpt(const std::string& name, int ranks, int steps, const std::vector<std::string>& settings,
                    const std::vector<std::string>& environment = {}, const std::string& options = "") {
  const std::string directory = kRoot + "/" + name;
  fs::remove_all(directory);
  fs::create_directories(directory);
  std::string arguments = std::string("train ") + PARTRAIN_SOURCE_DIR + "/configs/gpt-tiny.toml --set model.seq_len=32" +
                          " --set train.global_batch=8 --set train.steps=" + std::to_string(steps) +
                          " --set log.dir=" + directory + " --set log.every=1 --set log.save_parameters=true" +
                          " --set data.path=" + PARTRAIN_DATA_DIR + "/text.h5 --set profile.enabled=false";
  for (const std::string& setting : settings) arguments += " --set '" + setting + "'";
  if (!options.empty()) arguments += " " + options;
  const std::string log = directory + ".log";
  const pid_t job = testing::spawn_job(ranks > 1 ? testing::job_command(ranks, arguments, log, environment)
                                                 : [&] {
                                                     std::string command;
                                                     for (const std::string& variable : environment)
                                                       command += "export " + variable + "; ";
                                                     return command + "exec " + PARTRAIN_BINARY + " " + arguments +
                                                            " > " + log + " 2>&1";
                                                   }());
  testing::JobGuard guard{job};
  const std::optional<int> status = testing::wait_for_job(job, 240);
  EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << arguments << "\n" << testing::read_text(log);
  return directory;
}

// The 2-stage x 2-replica plan of the bf16 test.
const std::vector<std::string> kTwoByTwo = {"parallel.planner=manual", "parallel.stages=2", "parallel.replicas=[2,2]",
                                            "parallel.boundaries=[\"h.1\"]", "train.microbatches=2",
                                            "parallel.recompute=none"};
const std::vector<std::string> kOneRank = {"parallel.planner=dpl", "train.microbatches=4", "parallel.recompute=none"};

std::vector<std::string> with(std::vector<std::string> settings, const std::vector<std::string>& extra) {
  settings.insert(settings.end(), extra.begin(), extra.end());
  return settings;
}

// Relative L2 distance between the /model tensors of two parameters.h5 files.
double parameter_distance(const std::string& actual_path, const std::string& expected_path) {
  const io::Hdf5File actual = io::Hdf5File::open_read(actual_path), expected = io::Hdf5File::open_read(expected_path);
  double difference = 0, norm = 0;
  for (const std::string& name : expected.dataset_names("model")) {
    const std::vector<float> a = actual.read<float>("model/" + name), e = expected.read<float>("model/" + name);
    EXPECT_EQ(a.size(), e.size()) << name;
    for (std::size_t i = 0; i < e.size() && i < a.size(); ++i) {
      difference += (double(a[i]) - e[i]) * (double(a[i]) - e[i]);
      norm += double(e[i]) * e[i];
    }
  }
  return std::sqrt(difference / norm);
}

std::string checkpoint_path(const std::string& directory, int step) {
  return directory + "/checkpoints/" + io::checkpoint_file_name(step);
}

// fp16 keeps 11 significant bits (unit roundoff 2^-11), bf16 8: fp16's rounding is 8 times finer,
// so the bf16 test's bands hold with room to spare — fp16 vs fp32 losses within 1e-3 relative and
// the parameters within 5e-3 relative L2; 4 ranks vs 1 within 1e-3 (losses) and 2^-7 (parameters).
TEST(Fp16Training, TracksFp32AndDistributesLikeOneRank) {
  const std::string fp32 = run_gpt("fp32", 1, 10, kOneRank);
  const std::string fp16 = run_gpt("fp16", 1, 10, with(kOneRank, {"train.precision=fp16"}));
  const std::string spread = run_gpt("fp16-2x2", 4, 10, with(kTwoByTwo, {"train.precision=fp16"}));
  if (HasFailure()) return;
  const nlohmann::json plan = nlohmann::json::parse(testing::read_text(spread + "/plan.json"));
  EXPECT_EQ(plan.at("precision"), "fp16");
  const std::vector<double> expected = testing::metric_values(fp32, "loss"), mixed = testing::metric_values(fp16, "loss"),
                            distributed = testing::metric_values(spread, "loss");
  ASSERT_EQ(expected.size(), 10u);
  ASSERT_EQ(mixed.size(), expected.size());
  ASSERT_EQ(distributed.size(), expected.size());
  bool differs = false;
  for (std::size_t step = 0; step < expected.size(); ++step) {
    EXPECT_NEAR(mixed[step], expected[step], 1e-3 * std::abs(expected[step])) << "fp16 vs fp32, step " << step + 1;
    EXPECT_NEAR(distributed[step], mixed[step], 1e-3 * std::abs(mixed[step])) << "fp16 4 ranks vs 1, step " << step + 1;
    differs = differs || mixed[step] != expected[step];
  }
  EXPECT_TRUE(differs) << "fp16 losses are bitwise the fp32 ones: mixed precision did not take effect";
  // No overflow in 10 steps at the default growth interval: the scale stays 2^16 on both.
  EXPECT_EQ(testing::metric_values(fp16, "loss_scale"), std::vector<double>(10, 65536.0));
  EXPECT_EQ(testing::metric_values(spread, "loss_scale"), std::vector<double>(10, 65536.0));
  EXPECT_EQ(testing::metric_values(spread, "skipped"), std::vector<double>(10, 0.0));
  EXPECT_TRUE(testing::metric_values(fp32, "loss_scale").empty()) << "fp32 rows carry no loss scale";
  const double versus_fp32 = parameter_distance(fp16 + "/parameters.h5", fp32 + "/parameters.h5");
  const double versus_one_rank = parameter_distance(spread + "/parameters.h5", fp16 + "/parameters.h5");
  std::printf("fp16 parameters after 10 steps: vs fp32 %.3g, 4 ranks vs 1 rank %.3g (relative L2)\n", versus_fp32,
              versus_one_rank);
  EXPECT_LE(versus_fp32, 5e-3);
  EXPECT_LE(versus_one_rank, 0x1p-7);
}

// Rank 3 (stage 1, replica 1: it writes no checkpoint tensor, so only the agreement makes the
// writers skip) gets an inf at step 4.
TEST(Fp16Training, ForcedOverflowSkipsThatStepOnEveryRank) {
  constexpr int kSkipped = 4, kSteps = 7;
  const std::string run = run_gpt(
      "overflow", 4, kSteps,
      with(kTwoByTwo, {"train.precision=fp16", "checkpoint.every=1", "checkpoint.keep=10"}),
      {std::string(io::kFaultInjectVariable) + "=gradient_overflow:3:" + std::to_string(kSkipped)});
  if (HasFailure()) return;
  std::vector<double> skipped(kSteps, 0.0), scales(kSteps, 32768.0);
  skipped[kSkipped - 1] = 1;
  for (int step = 0; step < kSkipped; ++step) scales[step] = 65536.0;  // step 4 ran at 2^16, then halved
  EXPECT_EQ(testing::metric_values(run, "skipped"), skipped);
  EXPECT_EQ(testing::metric_values(run, "loss_scale"), scales);
  for (const double loss : testing::metric_values(run, "loss")) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NE(testing::read_text(run + ".log").find("step 4/7 | "), std::string::npos);
  EXPECT_NE(testing::read_text(run + ".log").find("loss scale 65536 | skipped (overflow)"), std::string::npos)
      << testing::read_text(run + ".log");

  const io::Checkpoint before = io::read_checkpoint(checkpoint_path(run, kSkipped - 1));
  const io::Checkpoint after = io::read_checkpoint(checkpoint_path(run, kSkipped));
  const io::Checkpoint next = io::read_checkpoint(checkpoint_path(run, kSkipped + 1));
  ASSERT_EQ(before.tensors.size(), after.tensors.size());
  int model_tensors = 0;
  bool next_moved = false;
  for (const auto& [name, tensor] : before.tensors) {
    // Parameters, buffers and the optimizer state (AdamW's moments and step counts): bitwise equal.
    EXPECT_EQ(after.tensors.at(name).to_float_vector(), tensor.to_float_vector()) << name;
    model_tensors += name.starts_with("model/");
    next_moved = next_moved || (name.starts_with("model/") && next.tensors.at(name).to_float_vector() != tensor.to_float_vector());
  }
  EXPECT_GT(model_tensors, 10);
  EXPECT_TRUE(next_moved) << "step " << kSkipped + 1 << " did not update: training did not go on";
  EXPECT_EQ(before.info.loss_scale, 65536.0);
  EXPECT_EQ(before.info.loss_scale_good_steps, kSkipped - 1);
  EXPECT_EQ(after.info.loss_scale, 32768.0);
  EXPECT_EQ(after.info.loss_scale_good_steps, 0);
}

// With a growth interval of 3 and an overflow at step 2 the scale moves within a few steps:
// 2^16 (steps 1-2), 2^15 (steps 3-5), 2^16 from step 6; after step 4 the count is 2. A resume from
// the step-4 checkpoint must go on with 2^15 and grow after step 5 exactly as the uninterrupted run.
TEST(Fp16Training, ResumeRestoresTheScaleAndItsCount) {
  const std::vector<std::string> settings = {"train.precision=fp16", "train.loss_scale_growth_interval=3",
                                             "checkpoint.every=4", "checkpoint.keep=10", "parallel.planner=dpl",
                                             "train.microbatches=2", "parallel.recompute=none"};
  const std::string whole =
      run_gpt("resume-whole", 2, 8, settings, {std::string(io::kFaultInjectVariable) + "=gradient_overflow:1:2"});
  if (HasFailure()) return;
  const std::vector<double> scales = testing::metric_values(whole, "loss_scale");
  EXPECT_EQ(scales, (std::vector<double>{65536, 65536, 32768, 32768, 32768, 65536, 65536, 65536}));
  const io::Checkpoint middle = io::read_checkpoint(checkpoint_path(whole, 4));
  EXPECT_EQ(middle.info.loss_scale, 32768.0);
  EXPECT_EQ(middle.info.loss_scale_good_steps, 2);
  const std::string resumed = run_gpt("resume-resumed", 2, 8, settings, {}, "--resume " + checkpoint_path(whole, 4));
  if (HasFailure()) return;
  const std::vector<double> resumed_scales = testing::metric_values(resumed, "loss_scale");
  const std::vector<double> losses = testing::metric_values(whole, "loss"), resumed_losses = testing::metric_values(resumed, "loss");
  ASSERT_EQ(resumed_scales.size(), 4u);
  ASSERT_EQ(resumed_losses.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed_scales[i], scales[4 + i]) << "step " << 5 + i;
    EXPECT_EQ(resumed_losses[i], losses[4 + i]) << "step " << 5 + i;
  }
}

// A checkpoint of an fp32 run (no loss-scale attributes) resumes under fp16 from
// [train] initial_loss_scale; an fp16 checkpoint's attributes are the only difference in its file.
TEST(Fp16Training, Fp32CheckpointResumesUnderFp16) {
  const std::vector<std::string> settings = {"checkpoint.every=3", "parallel.planner=dpl", "train.microbatches=2",
                                             "parallel.recompute=none"};
  const std::string fp32 = run_gpt("from-fp32", 1, 3, settings);
  if (HasFailure()) return;
  EXPECT_EQ(io::read_checkpoint(checkpoint_path(fp32, 3)).info.loss_scale, 0.0);
  const std::string fp16 = run_gpt("from-fp32-fp16", 1, 5, with(settings, {"train.precision=fp16", "train.initial_loss_scale=1024"}),
                                   {}, "--resume " + checkpoint_path(fp32, 3));
  if (HasFailure()) return;
  EXPECT_EQ(testing::metric_values(fp16, "loss_scale"), (std::vector<double>{1024, 1024}));
}

}  // namespace
}  // namespace partrain
