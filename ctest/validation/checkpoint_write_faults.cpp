// Checkpoint write failures never hang (faults item 1), end to end with the real program on 4
// ranks under mpiexec (built into test_checkpoint_write_faults):
//  - a write failure injected on one rank (PARTRAIN_FAULT_INJECT=checkpoint_write:RANK:STEP): every
//    rank stops within seconds with one error line naming the file and the rank, the .tmp file is
//    gone, the earlier checkpoint verifies, and `--resume latest` finishes from it with the losses
//    the failed run logged; with [checkpoint] on_error = "continue" the run warns and finishes;
//  - the checkpoint directory on a small tmpfs that fills up (needs root: skipped with exit code 77
//    when `mount -t tmpfs` is refused): the same, with the OS error "No space left on device".
#include <gtest/gtest.h>

#include <sys/mount.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "support/partrain_jobs.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;
using testing::Clock;

const std::string kRoot = PARTRAIN_RUN_DIR;
constexpr int kRanks = 4, kSteps = 12, kEvery = 4, kFailingStep = 8, kVictim = 2;
// A failed write must end the whole job within this many seconds of the last logged step (the
// agreement is a few all-reduces; closing the damaged file a moment).
constexpr double kStopBound = 20.0;

struct FailedRun {
  int status = -1;
  std::string log;
  double seconds_after_last_step = 0;
};

// Runs `arguments` on kRanks ranks with `environment`, bounded; measures how long the job took to
// end after the last row of metrics.jsonl appeared.
FailedRun run_until_it_ends(const std::string& arguments, const std::string& directory, const std::string& log,
                            const std::vector<std::string>& environment) {
  const pid_t job = testing::spawn_job(testing::job_command(kRanks, arguments, log, environment));
  const testing::JobGuard guard{job};
  FailedRun run;
  std::size_t rows = 0;
  auto last_row = Clock::now();
  std::optional<int> status;
  const auto deadline = Clock::now() + std::chrono::seconds(240);
  while (!(status = testing::wait_for_job(job, 0.05)) && Clock::now() < deadline) {
    const std::size_t now_rows = testing::logged_steps(directory).size();
    if (now_rows != rows) rows = now_rows, last_row = Clock::now();
  }
  run.seconds_after_last_step = std::chrono::duration<double>(Clock::now() - last_row).count();
  run.status = status ? *status : -1;
  run.log = testing::read_text(log);
  return run;
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t found = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++found;
  return found;
}

std::vector<std::string> temporary_files(const std::string& directory) {
  std::vector<std::string> files;
  std::error_code code;
  for (const auto& entry : fs::directory_iterator(directory, code))
    if (entry.path().extension() == ".tmp") files.push_back(entry.path().string());
  return files;
}

// The checks every failed write must pass: it ended soon, with exit code 1 and one error line that
// names the final path and `reason`; no .tmp file; the checkpoint before it intact.
void expect_stopped_cleanly(const FailedRun& run, const std::string& checkpoints, const std::string& reason) {
  const std::string failed = checkpoints + "/" + io::checkpoint_file_name(kFailingStep);
  EXPECT_EQ(exit_code(run.status), 1) << run.log;
  EXPECT_LT(run.seconds_after_last_step, kStopBound) << run.log;
  EXPECT_EQ(count(run.log, "partrain: error: cannot write checkpoint " + failed + ": rank "), 1u) << run.log;
  EXPECT_NE(run.log.find(reason), std::string::npos) << run.log;
  EXPECT_EQ(count(run.log, "partrain: error"), 1u) << "one error line\n" << run.log;
  EXPECT_EQ(run.log.find("HDF5-DIAG"), std::string::npos) << "HDF5's own error stack is silenced\n" << run.log;
  EXPECT_TRUE(temporary_files(checkpoints).empty()) << temporary_files(checkpoints).front();
  EXPECT_FALSE(fs::exists(failed));
  std::vector<std::string> skipped;
  EXPECT_EQ(io::latest_valid_checkpoint(checkpoints, &skipped), checkpoints + "/" + io::checkpoint_file_name(kEvery));
  EXPECT_TRUE(skipped.empty());
}

// `--resume latest` after a failed write: resumes from step kEvery, logs every step once, and
// recomputes the steps the failed run logged past it with the same losses.
void expect_resume_works(const std::string& directory, const std::string& extra_arguments,
                         const std::vector<double>& losses_before) {
  const testing::PartrainRun run = testing::run_partrain(
      kRanks, testing::gpt_four_rank_arguments(directory, kSteps, kEvery) + extra_arguments + " --resume latest",
      directory + "-resumed.log");
  ASSERT_EQ(run.status, 0) << run.log;
  EXPECT_NE(run.log.find("(step " + std::to_string(kEvery) + ")"), std::string::npos) << run.log;
  std::vector<std::int64_t> every_step;
  for (int step = 1; step <= kSteps; ++step) every_step.push_back(step);
  EXPECT_EQ(testing::logged_steps(directory), every_step);
  const std::vector<double> losses = testing::metric_values(directory, "loss");
  ASSERT_EQ(losses.size(), static_cast<std::size_t>(kSteps));
  ASSERT_GT(losses_before.size(), static_cast<std::size_t>(kEvery));
  for (std::size_t i = 0; i < losses_before.size(); ++i) EXPECT_EQ(losses[i], losses_before[i]) << "step " << i + 1;
}

TEST(CheckpointWriteFault, InjectedOnOneRankStopsEveryRankAndResumeWorks) {
  const std::string directory = kRoot + "/injected";
  fs::remove_all(directory);
  fs::create_directories(kRoot);
  const FailedRun run = run_until_it_ends(
      testing::gpt_four_rank_arguments(directory, kSteps, kEvery), directory, directory + ".log",
      {std::string(io::kFaultInjectVariable) + "=checkpoint_write:" + std::to_string(kVictim) + ":" +
       std::to_string(kFailingStep)});
  std::printf("the job ended %.2f s after its last step\n", run.seconds_after_last_step);
  expect_stopped_cleanly(run, directory + "/checkpoints", "rank " + std::to_string(kVictim) + ": ");
  EXPECT_NE(run.log.find("(fault injected by PARTRAIN_FAULT_INJECT)"), std::string::npos) << run.log;
  expect_resume_works(directory, "", testing::metric_values(directory, "loss"));
}

// An I/O error inside the collective write on one rank (the hook makes rank kVictim leave it):
// the others wait inside HDF5 where no agreement reaches them; [checkpoint] write_timeout ends
// every rank with a line naming the file, the .tmp file is removed, and resume works.
TEST(CheckpointWriteFault, RankLeavingTheCollectiveWriteEndsTheJobAtTheTimeout) {
  const std::string directory = kRoot + "/abandoned";
  fs::remove_all(directory);
  fs::create_directories(kRoot);
  constexpr double kTimeout = 5;
  const std::string timeout = " --set checkpoint.write_timeout=5";
  const FailedRun run = run_until_it_ends(
      testing::gpt_four_rank_arguments(directory, kSteps, kEvery) + timeout, directory, directory + ".log",
      {std::string(io::kFaultInjectVariable) + "=checkpoint_write_abandon:" + std::to_string(kVictim) + ":" +
       std::to_string(kFailingStep)});
  std::printf("the job ended %.2f s after its last step\n", run.seconds_after_last_step);
  const std::string checkpoints = directory + "/checkpoints";
  const std::string failed = checkpoints + "/" + io::checkpoint_file_name(kFailingStep);
  EXPECT_NE(exit_code(run.status), 0) << run.log;
  EXPECT_LT(run.seconds_after_last_step, kStopBound + kTimeout) << run.log;
  EXPECT_GE(count(run.log, "partrain: error: cannot write checkpoint " + failed +
                               ": a collective step of the write did not end within 5 s on rank "),
            1u)
      << run.log;
  EXPECT_EQ(run.log.find("HDF5-DIAG"), std::string::npos) << run.log;
  EXPECT_TRUE(temporary_files(checkpoints).empty()) << temporary_files(checkpoints).front();
  EXPECT_FALSE(fs::exists(failed));
  EXPECT_EQ(io::latest_valid_checkpoint(checkpoints, nullptr), checkpoints + "/" + io::checkpoint_file_name(kEvery));
  expect_resume_works(directory, timeout, testing::metric_values(directory, "loss"));
}

TEST(CheckpointWriteFault, OnErrorContinueWarnsAndFinishes) {
  const std::string directory = kRoot + "/continue";
  fs::remove_all(directory);
  fs::create_directories(kRoot);
  const FailedRun run = run_until_it_ends(
      testing::gpt_four_rank_arguments(directory, kSteps, kEvery) + " --set checkpoint.on_error=continue", directory,
      directory + ".log",
      {std::string(io::kFaultInjectVariable) + "=checkpoint_write:" + std::to_string(kVictim) + ":" +
       std::to_string(kFailingStep)});
  const std::string checkpoints = directory + "/checkpoints";
  EXPECT_EQ(exit_code(run.status), 0) << run.log;
  EXPECT_EQ(count(run.log, "warning: cannot write checkpoint " + checkpoints + "/step_000008.h5: rank 2: "), 1u)
      << run.log;
  EXPECT_NE(run.log.find("training goes on ([checkpoint] on_error = \"continue\")"), std::string::npos) << run.log;
  EXPECT_EQ(run.log.find("partrain: error"), std::string::npos) << run.log;
  EXPECT_EQ(testing::logged_steps(directory).size(), static_cast<std::size_t>(kSteps));
  EXPECT_EQ(io::list_checkpoints(checkpoints),
            (std::vector<std::string>{checkpoints + "/step_000012.h5", checkpoints + "/step_000004.h5"}));
  EXPECT_TRUE(temporary_files(checkpoints).empty());
}

// Unmounts the tmpfs when the test ends.
struct Unmount {
  std::string target;
  ~Unmount() { ::umount2(target.c_str(), MNT_DETACH); }
};

TEST(CheckpointWriteFault, FullTmpfsStopsEveryRankWithTheOsError) {
  const std::string directory = kRoot + "/tmpfs-run", mount_point = kRoot + "/tmpfs";
  fs::remove_all(directory);
  ::umount2(mount_point.c_str(), MNT_DETACH);
  fs::remove_all(mount_point);
  fs::create_directories(mount_point);
  // gpt-tiny's checkpoint takes 17 MiB (23 MiB reserved while written): the first fits, the second not.
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=30m") != 0) {
    std::printf("SKIPPED: mount -t tmpfs -o size=30m tmpfs %s refused: %s (needs root)\n", mount_point.c_str(),
                std::strerror(errno));
    std::fflush(stdout);
    std::exit(77);
  }
  const Unmount unmount{mount_point};
  const std::string checkpoints = mount_point + "/checkpoints";
  const std::string on_tmpfs = " --set checkpoint.dir=" + checkpoints;
  const FailedRun run = run_until_it_ends(testing::gpt_four_rank_arguments(directory, kSteps, kEvery) + on_tmpfs,
                                          directory, directory + ".log", {});
  std::printf("the job ended %.2f s after its last step\n", run.seconds_after_last_step);
  expect_stopped_cleanly(run, checkpoints, "No space left on device");
  // Resume from the tmpfs without writing there again (it is still nearly full).
  expect_resume_works(directory, on_tmpfs + " --set checkpoint.every=0", testing::metric_values(directory, "loss"));
}

}  // namespace
}  // namespace partrain
