// Kill-and-resume soak (issue 30 item 4), end to end with the real program under mpiexec: a 4-rank
// gpt-tiny run of kSteps steps with a checkpoint every kEvery steps is interrupted at seeded random
// moments, at least kInterruptions times, each in one of three ways:
//  - SIGKILL of one random rank (mpiexec then ends the others),
//  - SIGTERM to mpiexec (it forwards the signal; ranks that see it checkpoint and stop, the rest are
//    killed),
//  - a failure injected into one rank's checkpoint write (PARTRAIN_FAULT_INJECT; every rank stops
//    with the same error and the half-written file is removed);
// and resumed with `--resume latest` into the same directory each time, until a run completes. Then
// the final parameters are bitwise those of an uninterrupted run, metrics.jsonl holds every step
// once, and the checkpoint folder holds no .tmp file and only valid checkpoints. PARTRAIN_SOAK_SEED
// (default 1) replays a failure.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hdf5_file.h"
#include "support/partrain_jobs.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;
using testing::eventually;
using testing::job_command;
using testing::job_rank_pids;
using testing::JobGuard;
using testing::logged_steps;
using testing::read_text;
using testing::spawn_job;
using testing::wait_for_job;

constexpr int kRanks = 4, kSteps = 160, kEvery = 5, kInterruptions = 10;
const std::string kRoot = PARTRAIN_RUN_DIR;

enum class Interruption { KillRank, TerminateLauncher, FailCheckpointWrite };

const char* interruption_name(Interruption kind) {
  switch (kind) {
    case Interruption::KillRank: return "SIGKILL of one rank";
    case Interruption::TerminateLauncher: return "SIGTERM to mpiexec";
    default: return "checkpoint write failure injected";
  }
}

std::string arguments(const std::string& directory) {
  return testing::gpt_four_rank_arguments(directory, kSteps, kEvery) +
         " --set profile.enabled=false --set log.save_parameters=true --set log.trace= --set log.every=20";
}

std::int64_t last_logged(const std::string& directory) {
  const std::vector<std::int64_t> steps = logged_steps(directory);
  return steps.empty() ? 0 : steps.back();
}

// Every parameter (/model/<name>) of `expected` is in `actual` with the same shape and bitwise the
// same values.
void expect_bitwise_equal(const std::string& expected_path, const std::string& actual_path) {
  const io::Hdf5File expected = io::Hdf5File::open_read(expected_path), actual = io::Hdf5File::open_read(actual_path);
  const std::vector<std::string> names = expected.dataset_names("model");
  EXPECT_FALSE(names.empty()) << expected_path << " holds no parameters";
  EXPECT_EQ(actual.dataset_names("model").size(), names.size()) << actual_path;
  for (const std::string& name : names) {
    const std::string dataset = "model/" + name;
    ASSERT_TRUE(actual.has_dataset(dataset)) << actual_path << " has no " << dataset;
    std::vector<std::int64_t> expected_shape, actual_shape;
    const std::vector<float> a = expected.read<float>(dataset, &expected_shape);
    const std::vector<float> b = actual.read<float>(dataset, &actual_shape);
    EXPECT_EQ(expected_shape, actual_shape) << dataset;
    EXPECT_TRUE(a == b) << dataset << " differs from the uninterrupted run's";
  }
}

TEST(KillResumeSoak, RandomInterruptionsLeaveTheUninterruptedRunsParameters) {
  const unsigned seed = static_cast<unsigned>(std::strtoul(std::getenv("PARTRAIN_SOAK_SEED") ? std::getenv("PARTRAIN_SOAK_SEED") : "1", nullptr, 10));
  SCOPED_TRACE("replay: PARTRAIN_SOAK_SEED=" + std::to_string(seed));
  std::mt19937 random(seed);
  const auto uniform = [&](int low, int high) { return std::uniform_int_distribution<int>(low, high)(random); };
  const std::string straight = kRoot + "/soak-straight", soak = kRoot + "/soak";
  fs::remove_all(straight);
  fs::remove_all(soak);
  fs::create_directories(kRoot);
  const testing::PartrainRun reference = testing::run_partrain(kRanks, arguments(straight), straight + ".log");
  ASSERT_EQ(reference.status, 0) << reference.log;

  // Each kind at least three times, in a seeded order.
  std::vector<Interruption> plan;
  for (int i = 0; i < kInterruptions + 2; ++i)
    plan.push_back(std::array{Interruption::KillRank, Interruption::TerminateLauncher,
                              Interruption::FailCheckpointWrite}[i % 3]);
  std::shuffle(plan.begin(), plan.end(), random);
  int interrupted = 0, launches = 0;
  bool completed = false;
  for (const Interruption kind : plan) {
    const std::int64_t start = last_logged(soak);
    if (start >= kSteps - kEvery) break;  // too close to the end to interrupt: let it finish
    std::vector<std::string> environment;
    std::int64_t target = start + uniform(1, 2 * kEvery);
    if (kind == Interruption::FailCheckpointWrite) {
      // The first checkpoint at or after `target` fails on a random rank.
      const std::int64_t step = std::min<std::int64_t>((target + kEvery - 1) / kEvery * kEvery, kSteps - kEvery);
      environment.push_back(std::string(io::kFaultInjectVariable) + "=checkpoint_write:" +
                            std::to_string(uniform(0, kRanks - 1)) + ":" + std::to_string(step));
    }
    const std::string log = soak + "-launch" + std::to_string(++launches) + ".log";
    const pid_t job = spawn_job(job_command(kRanks, arguments(soak) + " --resume auto", log, environment));
    const JobGuard guard{job};
    std::printf("launch %d from step %lld: %s", launches, static_cast<long long>(start), interruption_name(kind));
    if (kind != Interruption::FailCheckpointWrite) {
      // The moment: once the run has logged `target`, or when it ends by itself.
      ASSERT_TRUE(eventually([&] { return last_logged(soak) >= target || wait_for_job(job, 0).has_value(); }, 240))
          << read_text(log);
      std::printf(" after step %lld", static_cast<long long>(last_logged(soak)));
      if (kind == Interruption::KillRank) {
        const std::vector<pid_t> ranks = job_rank_pids(job, kRanks);
        const int victim = uniform(0, kRanks - 1);
        if (ranks[victim] > 0) ::kill(ranks[victim], SIGKILL);
      } else {
        ::kill(job, SIGTERM);
      }
    }
    const std::optional<int> status = wait_for_job(job, 240);
    ASSERT_TRUE(status.has_value()) << "launch " << launches << " did not end\n" << read_text(log);
    const bool success = WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    std::printf(": ended %s, %lld steps logged\n", success ? "normally" : "interrupted",
                static_cast<long long>(last_logged(soak)));
    std::fflush(stdout);
    if (success && last_logged(soak) == kSteps) {
      completed = true;
      break;
    }
    ASSERT_FALSE(success) << "launch " << launches << " exited 0 before step " << kSteps << "\n" << read_text(log);
    ++interrupted;
  }
  EXPECT_GE(interrupted, kInterruptions) << "too few interruptions: raise kSteps";
  if (!completed) {
    const testing::PartrainRun last = testing::run_partrain(kRanks, arguments(soak) + " --resume latest", soak + ".log");
    ASSERT_EQ(last.status, 0) << last.log;
  }

  std::vector<std::int64_t> every_step;
  for (int step = 1; step <= kSteps; ++step) every_step.push_back(step);
  EXPECT_EQ(logged_steps(soak), every_step) << "every step once in metrics.jsonl";
  EXPECT_EQ(testing::metric_values(soak, "loss"), testing::metric_values(straight, "loss"));
  expect_bitwise_equal(straight + "/parameters.h5", soak + "/parameters.h5");
  std::vector<std::string> skipped;
  EXPECT_EQ(io::latest_valid_checkpoint(soak + "/checkpoints", &skipped),
            soak + "/checkpoints/" + io::checkpoint_file_name(kSteps));
  EXPECT_TRUE(skipped.empty()) << "damaged checkpoints left: " << skipped.size();
  for (const auto& entry : fs::directory_iterator(soak + "/checkpoints"))
    EXPECT_EQ(entry.path().extension(), ".h5") << entry.path() << " left behind";
}

}  // namespace
}  // namespace partrain
