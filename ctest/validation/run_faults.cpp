// Faults without loss, end to end with the real program under mpiexec (built into test_run_faults):
//  - one run per directory: a second run into the directory of a running one fails at once naming
//    the first's pid, and the first finishes with its metrics and checkpoint intact (label mpi);
//  - a rank killed with SIGKILL mid-run takes the whole job down within kKillBound seconds (Open
//    MPI's mpiexec notices the death and kills the other ranks), and `--resume latest` into the same
//    directory finishes with every step logged once and the losses of an uninterrupted run (labels
//    validation;mpi).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "support/partrain_jobs.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;
using testing::Clock;
using testing::eventually;
using testing::job_command;
using testing::job_rank_pids;
using testing::JobGuard;
using testing::logged_steps;
using testing::read_text;
using testing::spawn_job;
using testing::wait_for_job;

const std::string kRoot = PARTRAIN_RUN_DIR;
// After one rank dies of SIGKILL, every rank and mpiexec itself must be gone within this many
// seconds. Open MPI 4.1's mpiexec sees the child die at once, prints "mpiexec noticed that process
// rank R ... exited on signal 9", and kills the other ranks (SIGTERM, then SIGKILL); measured well
// under a second on the 2-core CI machine.
constexpr double kKillBound = 10.0;

// Whether the spawned `pid` has not exited yet (it is not reaped: wait_for still sees its status).
bool running(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
}

bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");  // a zombie is gone too
  const std::size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// gpt-tiny for `steps` steps on 4 ranks (2 stages x 2 replicas) or 2 ranks (dpl), checkpoints every
// `every` steps, outputs in `directory`.
std::string gpt_arguments(int ranks, const std::string& directory, int steps, int every) {
  std::string arguments =
      std::string("train ") + PARTRAIN_SOURCE_DIR + "/configs/gpt-tiny.toml" +
      " --set train.steps=" + std::to_string(steps) +
      " --set train.global_batch=8 --set model.seq_len=32 --set checkpoint.every=" + std::to_string(every) +
      " --set log.dir=" + directory + " --set data.path=" + PARTRAIN_DATA_DIR + "/text.h5";
  if (ranks == 4) {
    arguments +=
        " --set parallel.planner=manual --set parallel.stages=2 --set 'parallel.replicas=[2,2]'"
        " --set 'parallel.boundaries=[\"h.1\"]' --set train.microbatches=2";
  } else {
    arguments += " --set parallel.planner=dpl";
  }
  return arguments;
}

TEST(RunLock, SecondRunIntoTheSameDirectoryFailsAtOnce) {
  const std::string directory = kRoot + "/locked";
  fs::remove_all(directory);
  fs::create_directories(kRoot);
  constexpr int kSteps = 40;
  const pid_t first = spawn_job(job_command(2, gpt_arguments(2, directory, kSteps, 20), directory + "-first.log"));
  const JobGuard guard{first};
  // The lock is taken before profiling: wait for the lock file to name its holder.
  std::string holder;
  ASSERT_TRUE(eventually(
      [&] {
        holder = read_text(directory + "/.lock");
        return (holder.find("pid=") != std::string::npos && holder.back() == '\n') || !running(first);
      },
      120));
  ASSERT_TRUE(running(first)) << "the first run ended early\n" << read_text(directory + "-first.log");
  const std::size_t at = holder.find("pid=") + 4;
  const std::string pid = holder.substr(at, holder.find('\n', at) - at);

  const auto start = Clock::now();
  const testing::PartrainRun second =
      testing::run_partrain(2, gpt_arguments(2, directory, kSteps, 20), directory + "-second.log");
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const bool first_still_running = running(first);
  EXPECT_NE(second.status, 0) << second.log;
  EXPECT_LT(seconds, 30) << "the second run should stop at start\n" << second.log;
  EXPECT_NE(second.log.find("partrain: error: " + directory + " is in use by another run (host "), std::string::npos)
      << second.log;
  EXPECT_NE(second.log.find(", pid " + pid + ", started "), std::string::npos) << "holder pid " << pid << "\n"
                                                                               << second.log;
  EXPECT_EQ(second.log.find("partrain: error:"), second.log.rfind("partrain: error:")) << "one error line\n"
                                                                                       << second.log;
  EXPECT_EQ(second.log.find("profil"), std::string::npos) << "stopped before profiling\n" << second.log;
  ASSERT_TRUE(first_still_running) << "the first run ended before the second was refused: give it more steps";

  const std::optional<int> status = wait_for_job(first, 240);
  ASSERT_TRUE(status.has_value()) << "the first run did not finish";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << read_text(directory + "-first.log");
  std::vector<std::int64_t> expected;
  for (int step = 1; step <= kSteps; ++step) expected.push_back(step);
  EXPECT_EQ(logged_steps(directory), expected);
  std::vector<std::string> skipped;
  EXPECT_EQ(io::latest_valid_checkpoint(directory + "/checkpoints", &skipped),
            directory + "/checkpoints/step_000040.h5");
  EXPECT_TRUE(skipped.empty());
  EXPECT_TRUE(fs::exists(directory + "/plan.json"));
  EXPECT_EQ(fs::file_size(directory + "/.lock"), 0u) << "a run that ends normally empties its lock file";
}

TEST(KillAndResume, EveryStepOnceWithTheLossesOfAnUninterruptedRun) {
  constexpr int kRanks = 4, kSteps = 12, kEvery = 4, kKillAfter = 5, kVictim = 3;
  const std::string straight = kRoot + "/kill-straight", resumed = kRoot + "/kill-resumed";
  fs::remove_all(straight);
  fs::remove_all(resumed);
  fs::create_directories(kRoot);
  const testing::PartrainRun reference =
      testing::run_partrain(kRanks, gpt_arguments(kRanks, straight, kSteps, kEvery), straight + ".log");
  ASSERT_EQ(reference.status, 0) << reference.log;
  const std::vector<double> expected = testing::metric_values(straight, "loss");
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kSteps));

  // The same run, killed (one rank, SIGKILL) once step kKillAfter is logged: the checkpoint of
  // step 4 is written, steps past it are in metrics.jsonl.
  const pid_t job =
      spawn_job(job_command(kRanks, gpt_arguments(kRanks, resumed, kSteps, kEvery), resumed + "-killed.log"));
  const JobGuard guard{job};
  ASSERT_TRUE(eventually([&] { return logged_steps(resumed).size() >= kKillAfter; }, 180))
      << read_text(resumed + "-killed.log");
  const std::vector<pid_t> ranks = job_rank_pids(job, kRanks);
  for (int rank = 0; rank < kRanks; ++rank) ASSERT_GT(ranks[rank], 0) << "rank " << rank << " not found";
  ASSERT_EQ(::kill(ranks[kVictim], SIGKILL), 0);
  const auto killed = Clock::now();
  const std::optional<int> status = wait_for_job(job, kKillBound);
  ASSERT_TRUE(status.has_value()) << "mpiexec still runs " << kKillBound << " s after rank " << kVictim
                                  << " was killed";
  ASSERT_TRUE(eventually([&] { return std::all_of(ranks.begin(), ranks.end(), process_gone); },
                         kKillBound - std::chrono::duration<double>(Clock::now() - killed).count()))
      << "a rank outlived the job by more than " << kKillBound << " s";
  std::printf("every rank gone %.2f s after rank %d was killed\n",
              std::chrono::duration<double>(Clock::now() - killed).count(), kVictim);
  EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << read_text(resumed + "-killed.log");
  const std::vector<std::int64_t> logged_before = logged_steps(resumed);
  ASSERT_LT(logged_before.back(), kSteps) << "the kill came after the last step";

  // Resume into the same directory: it takes over the lock the killed run left, drops the rows past
  // the checkpoint, and logs every step once more.
  const testing::PartrainRun run = testing::run_partrain(
      kRanks, gpt_arguments(kRanks, resumed, kSteps, kEvery) + " --resume latest", resumed + ".log");
  ASSERT_EQ(run.status, 0) << run.log;
  const std::size_t at = run.log.find("resume: " + resumed + "/checkpoints/step_");
  ASSERT_NE(at, std::string::npos) << run.log;
  const std::int64_t resumed_step = std::stoll(run.log.substr(run.log.find("(step ", at) + 6));
  EXPECT_LT(resumed_step, logged_before.back()) << "the killed run logged no step past its checkpoint";
  EXPECT_NE(run.log.find("resume: dropped " + std::to_string(logged_before.back() - resumed_step) + " rows"),
            std::string::npos)
      << run.log;
  EXPECT_NE(run.log.find("warning: " + resumed + "/.lock was left by a run that is gone"), std::string::npos)
      << run.log;
  std::vector<std::int64_t> every_step;
  for (int step = 1; step <= kSteps; ++step) every_step.push_back(step);
  EXPECT_EQ(logged_steps(resumed), every_step);
  const std::vector<double> actual = testing::metric_values(resumed, "loss");
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace partrain
