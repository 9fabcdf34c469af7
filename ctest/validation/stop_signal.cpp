// Stopping on a signal (faults item 4), end to end with the real program on 4 ranks under mpiexec
// (built into test_stop_signal): SIGUSR1 sent to one rank (not rank 0) of a running job makes every
// rank stop at the same step boundary, write a checkpoint of that step and exit with code 3; then
// `--resume latest` finishes with the losses of an uninterrupted run, every step logged once.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "support/partrain_jobs.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

const std::string kRoot = PARTRAIN_RUN_DIR;
constexpr int kRanks = 4, kSteps = 30, kSignalAfter = 3, kVictim = 2;
constexpr int kExitStoppedBySignal = 3;  // documented in README "Faults" and app/stop_signals.h
constexpr double kStopBound = 20.0;      // seconds from the signal to the end of the job

TEST(StopSignal, UsrOneOnOneRankCheckpointsExitsThreeAndResumesExactly) {
  const std::string straight = kRoot + "/straight", stopped = kRoot + "/stopped";
  fs::remove_all(straight);
  fs::remove_all(stopped);
  fs::create_directories(kRoot);
  const testing::PartrainRun reference =
      testing::run_partrain(kRanks, testing::gpt_four_rank_arguments(straight, kSteps, 0), straight + ".log");
  ASSERT_EQ(reference.status, 0) << reference.log;
  const std::vector<double> expected = testing::metric_values(straight, "loss");
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kSteps));

  const pid_t job = testing::spawn_job(
      testing::job_command(kRanks, testing::gpt_four_rank_arguments(stopped, kSteps, 0), stopped + "-stopped.log"));
  const testing::JobGuard guard{job};
  ASSERT_TRUE(testing::eventually([&] { return testing::logged_steps(stopped).size() >= kSignalAfter; }, 180))
      << testing::read_text(stopped + "-stopped.log");
  const std::vector<pid_t> ranks = testing::job_rank_pids(job, kRanks);
  ASSERT_GT(ranks[kVictim], 0) << "rank " << kVictim << " not found";
  ASSERT_EQ(::kill(ranks[kVictim], SIGUSR1), 0);
  const std::optional<int> status = testing::wait_for_job(job, kStopBound);
  const std::string log = testing::read_text(stopped + "-stopped.log");
  ASSERT_TRUE(status.has_value()) << "the job still runs " << kStopBound << " s after SIGUSR1\n" << log;
  ASSERT_TRUE(WIFEXITED(*status)) << log;
  EXPECT_EQ(WEXITSTATUS(*status), kExitStoppedBySignal) << log;

  // It stopped after the last step it logged, with a checkpoint of that step, before the end.
  const std::vector<std::int64_t> logged = testing::logged_steps(stopped);
  ASSERT_FALSE(logged.empty());
  const std::int64_t last = logged.back();
  ASSERT_LT(last, kSteps) << "the signal came after the last step: give the run more steps";
  const std::string checkpoint = stopped + "/checkpoints/" + io::checkpoint_file_name(last);
  EXPECT_NE(log.find("stopped by SIGUSR1 after step " + std::to_string(last) + " of " + std::to_string(kSteps) +
                     ": checkpoint " + checkpoint + "; resume with --resume latest (exit code 3)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("partrain: error"), std::string::npos) << log;
  std::vector<std::string> skipped;
  EXPECT_EQ(io::latest_valid_checkpoint(stopped + "/checkpoints", &skipped), checkpoint);

  const testing::PartrainRun resumed = testing::run_partrain(
      kRanks, testing::gpt_four_rank_arguments(stopped, kSteps, 0) + " --resume latest", stopped + "-resumed.log");
  ASSERT_EQ(resumed.status, 0) << resumed.log;
  EXPECT_NE(resumed.log.find("resume: " + checkpoint + " (step " + std::to_string(last) + ")"), std::string::npos)
      << resumed.log;
  std::vector<std::int64_t> every_step;
  for (int step = 1; step <= kSteps; ++step) every_step.push_back(step);
  EXPECT_EQ(testing::logged_steps(stopped), every_step);
  const std::vector<double> actual = testing::metric_values(stopped, "loss");
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace partrain
