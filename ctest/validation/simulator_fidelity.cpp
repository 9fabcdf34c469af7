// The timeline simulator against a real run (issue 14): a 4-rank pipeline (4 stages) of gpt-tiny runs
// under gpipe, 1f1b and scp with a trace; the simulator gets the measured duration of every compute
// and Step action of each step (the executor's trace holds one event per action, in list order) and
// each stage's all-reduce (the shortest of its members' measured AllReduce: the last to arrive waits
// least), transfers free; its step time must match the measured step time (metrics.jsonl "seconds")
// within 10% in the median over the steps after the first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.h"
#include "plan/schedule.h"
#include "plan/schedule_simulator.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

constexpr int kSteps = 8;

class SimulatorFidelity : public ::testing::TestWithParam<std::string> {};

TEST_P(SimulatorFidelity, SimulatedStepMatchesTheMeasuredOne) {
  const std::string schedule_kind = GetParam();
  const std::string directory = std::string(PARTRAIN_RUN_DIR) + "/fidelity-" + schedule_kind + "-" + std::to_string(::getpid());
  std::ostringstream arguments;
  arguments << "train " << PARTRAIN_SOURCE_DIR << "/configs/gpt-tiny.toml --set train.steps=" << kSteps
            << " --set train.global_batch=16 --set train.microbatches=4 --set parallel.planner=manual"
            << " --set parallel.stages=4 --set 'parallel.replicas=[1,1,1,1]'"
            << " --set 'parallel.boundaries=[\"h.0\",\"h.1\",\"ln_f\"]' --set parallel.recompute=boundaries"
            << " --set parallel.schedule=" << schedule_kind << " --set profile.enabled=false"
            << " --set log.dir=" << directory << " --set log.trace=trace.json --set checkpoint.every=0"
            << " --set data.path=" << PARTRAIN_DATA_DIR << "/text.h5";
  const testing::PartrainRun run = testing::run_partrain(4, arguments.str(), directory + ".log");
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;

  const Plan plan = Plan::load(directory + "/plan.json");
  const Schedule schedule = generate_schedule(plan);
  const std::vector<double> measured = testing::metric_values(directory, "seconds");
  ASSERT_EQ(measured.size(), static_cast<std::size_t>(kSteps));
  // Per rank and step: the durations (seconds) of its events, in action order.
  std::map<std::pair<int, std::int64_t>, std::vector<double>> durations;
  const nlohmann::json trace = nlohmann::json::parse(std::ifstream(directory + "/trace.json"));
  const nlohmann::json& events = trace.is_object() ? trace.at("traceEvents") : trace;
  for (const nlohmann::json& event : events) {
    if (event.value("ph", "") != "X" || event.value("tid", 0) != 0) continue;  // tid 0: the actions
    durations[{event.at("pid").get<int>(), event.at("args").at("step").get<std::int64_t>()}].push_back(
        event.at("dur").get<double>() * 1e-6);
  }

  std::vector<double> errors;
  for (std::int64_t step = 1; step < kSteps; ++step) {
    TimelineCosts costs;
    costs.forward_seconds.assign(plan.stages.size(), 0.0);
    costs.backward_seconds.assign(plan.stages.size(), 0.0);
    costs.recompute_seconds.assign(plan.stages.size(), 0.0);
    std::vector<double> all_reduce(plan.stages.size(), INFINITY);
    for (int rank = 0; rank < plan.world_size; ++rank) {
      const std::vector<double>& measured_actions = durations[{rank, step}];
      ASSERT_EQ(measured_actions.size(), schedule[rank].size()) << "rank " << rank << " step " << step;
      for (std::size_t i = 0; i < schedule[rank].size(); ++i)
        if (schedule[rank][i].kind == ActionKind::AllReduce) {
          double& stage = all_reduce[plan.placement_of(rank).stage];
          stage = std::min(stage, measured_actions[i]);
        }
    }
    costs.action_seconds = [&](int rank, std::size_t index) { return durations[{rank, step}].at(index); };
    costs.all_reduce_seconds = [&](int stage) { return std::isfinite(all_reduce[stage]) ? all_reduce[stage] : 0.0; };
    const TimelinePrediction prediction = simulate_schedule(plan, schedule, costs);
    const double error = (prediction.step_seconds - measured[step]) / measured[step];
    std::printf("%s step %lld: measured %.4f s, simulated %.4f s (%+.1f%%)\n", schedule_kind.c_str(),
                static_cast<long long>(step + 1), measured[step], prediction.step_seconds, 100 * error);
    errors.push_back(error);
  }
  std::nth_element(errors.begin(), errors.begin() + errors.size() / 2, errors.end(),
                   [](double a, double b) { return std::abs(a) < std::abs(b); });
  EXPECT_LT(std::abs(errors[errors.size() / 2]), 0.10) << "median relative error of the simulated step time";
  std::filesystem::remove_all(directory);
}

INSTANTIATE_TEST_SUITE_P(Schedules, SimulatorFidelity, ::testing::Values("gpipe", "1f1b", "scp"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace partrain
