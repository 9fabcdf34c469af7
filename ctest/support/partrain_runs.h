#pragma once
// Running the real partrain program from end-to-end tests: under mpiexec for several ranks, bounded
// in time, with its output kept in a log file. Header-only: the test target defines PARTRAIN_BINARY,
// MPIEXEC and MPIEXEC_FLAGS (see ctest/CMakeLists.txt).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace partrain::testing {

struct PartrainRun {
  int status = -1;    // std::system's status (0: success)
  std::string log;    // stdout and stderr
  std::string command;
};

/// `arguments` of a `partrain train` with re-planning during training off unless they set it: the
/// end-to-end tests compare runs step for step and read the plan a run trained under, which a plan
/// switched in the middle would change (ctest/validation/replanning.cpp tests re-planning itself).
inline std::string without_replanning(const std::string& arguments) {
  if (arguments.rfind("train ", 0) != 0 || arguments.find("replan_threshold") != std::string::npos) return arguments;
  return arguments + " --set profile.replan_threshold=0";
}

/// Runs `partrain <arguments>` on `ranks` ranks (1: without mpiexec), output to `log_path`. A run is
/// bounded (240 s) because a rank that dies in MPI_Init can leave mpiexec waiting forever. Training
/// runs do not re-plan unless `arguments` set [profile] replan_threshold (without_replanning).
inline PartrainRun run_partrain(int ranks, const std::string& arguments, const std::string& log_path) {
  std::ostringstream command;
  command << "timeout --kill-after=10 240 ";
  if (ranks > 1) command << MPIEXEC << " -n " << ranks << " " << MPIEXEC_FLAGS << " ";
  command << PARTRAIN_BINARY << " " << without_replanning(arguments) << " > " << log_path << " 2>&1";
  std::filesystem::create_directories(std::filesystem::path(log_path).parent_path());
  PartrainRun run;
  run.command = command.str();
  run.status = std::system(run.command.c_str());
  std::ifstream log(log_path);
  std::stringstream text;
  text << log.rdbuf();
  run.log = text.str();
  return run;
}

/// The values of `key` in `directory`/metrics.jsonl, in line order (lines without the key skipped;
/// booleans as 0 and 1).
inline std::vector<double> metric_values(const std::string& directory, const std::string& key) {
  std::vector<double> result;
  std::ifstream metrics(directory + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (!record.contains(key)) continue;
    const nlohmann::json& value = record.at(key);
    result.push_back(value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>());  // "skipped": 0 or 1
  }
  return result;
}

}  // namespace partrain::testing
