#pragma once
// Background partrain jobs for end-to-end fault tests: start mpiexec in a process group of its
// own, find its ranks, signal them, wait with a bound, read metrics.jsonl while it runs.
// Header-only: the test target defines PARTRAIN_BINARY, MPIEXEC and MPIEXEC_FLAGS.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/partrain_runs.h"

namespace partrain::testing {

using Clock = std::chrono::steady_clock;

/// The whole text of `path` ("" when missing).
inline std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

/// `exec mpiexec -n RANKS ... partrain ARGUMENTS > LOG 2>&1`, with `environment` ("NAME=value ...",
/// exported to every rank with mpiexec -x) in front; a training run does not re-plan
/// (without_replanning).
inline std::string job_command(int ranks, const std::string& arguments, const std::string& log,
                               const std::vector<std::string>& environment = {}) {
  std::ostringstream command;
  for (const std::string& variable : environment) command << "export " << variable << "; ";
  command << "exec ";
  command << MPIEXEC << " -n " << ranks << " " << MPIEXEC_FLAGS << " ";
  for (const std::string& variable : environment) command << "-x " << variable.substr(0, variable.find('=')) << " ";
  command << PARTRAIN_BINARY << " " << without_replanning(arguments) << " > " << log << " 2>&1";
  return command.str();
}

/// Starts `command` under /bin/sh in a process group of its own; with "exec" the pid is mpiexec's.
inline pid_t spawn_job(const std::string& command) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::setpgid(0, 0);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(child, child);
  return child;
}

/// waitpid with a bound: the exit status, or nothing if `pid` still runs after `seconds`.
inline std::optional<int> wait_for_job(pid_t pid, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  do {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (Clock::now() < deadline);
  return std::nullopt;
}

/// Kills (SIGKILL, whole process group) a spawned job that a failed assertion left behind.
struct JobGuard {
  pid_t pid;
  ~JobGuard() {
    if (::waitpid(pid, nullptr, WNOHANG) == 0) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

/// Polls until `predicate` holds (true) or `seconds` pass (false).
template <typename Predicate>
bool eventually(Predicate predicate, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return predicate();
}

/// The "step" of every complete row of `directory`/metrics.jsonl (a row being written is skipped).
inline std::vector<std::int64_t> logged_steps(const std::string& directory) {
  std::vector<std::int64_t> steps;
  std::ifstream metrics(directory + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_object() && record.contains("step")) steps.push_back(record.at("step").get<std::int64_t>());
  }
  return steps;
}

/// The pids of the ranks mpiexec `launcher` started (its children), by OMPI_COMM_WORLD_RANK; -1
/// where not found.
inline std::vector<pid_t> job_rank_pids(pid_t launcher, int ranks) {
  std::vector<pid_t> pids(ranks, -1);
  for (const std::filesystem::directory_entry& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text(entry.path().string() + "/stat");
    const std::size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 2));
    char state = 0;
    long parent = 0;
    fields >> state >> parent;
    if (parent != launcher) continue;
    const std::string environment = read_text(entry.path().string() + "/environ");
    const std::string key = "OMPI_COMM_WORLD_RANK=";
    const std::size_t found = environment.find(key);
    if (found == std::string::npos || (found > 0 && environment[found - 1] != '\0')) continue;
    const int rank = std::atoi(environment.c_str() + found + key.size());
    if (rank >= 0 && rank < ranks) pids[rank] = static_cast<pid_t>(std::stol(name));
  }
  return pids;
}

/// gpt-tiny on 4 ranks (manual plan: 2 stages x 2 replicas, so every run trains bitwise the same
/// numbers) for `steps` steps, checkpoints every `every` steps (0: never), outputs in `directory`.
inline std::string gpt_four_rank_arguments(const std::string& directory, int steps, int every) {
  return std::string("train ") + PARTRAIN_SOURCE_DIR + "/configs/gpt-tiny.toml --set train.steps=" +
         std::to_string(steps) + " --set train.global_batch=8 --set model.seq_len=32 --set checkpoint.every=" +
         std::to_string(every) + " --set log.dir=" + directory + " --set data.path=" + PARTRAIN_DATA_DIR +
         "/text.h5 --set parallel.planner=manual --set parallel.stages=2 --set 'parallel.replicas=[2,2]'"
         " --set 'parallel.boundaries=[\"h.1\"]' --set train.microbatches=2";
}

}  // namespace partrain::testing
