// [log] op_profile = true end to end (issue 18, item 2): the real partrain program trains gpt-tiny
// for a few steps on 1 rank and as a 2-stage pipeline on 2 ranks; the run summary must hold one op
// profile per stage, naming the op types the stage runs (forward and backward apart), whose times
// sum to no more than the stage's summed step time (the ops run inside the steps). Off by default:
// no profile without the key. Built into test_op_profile (labels validation;mpi).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <numeric>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/partrain_runs.h"

namespace partrain {
namespace {

const std::string kRoot = PARTRAIN_RUN_DIR;

// One printed profile: seconds per (op, direction), and the "all ops" line's total and step time.
struct PrintedProfile {
  std::map<std::pair<std::string, std::string>, double> seconds;
  double all_ops = -1, step_seconds = -1;
};

// The profiles of the run summary by stage ("op profile, stage S (rank R), ...").
std::map<int, PrintedProfile> printed_profiles(const std::string& log) {
  std::map<int, PrintedProfile> profiles;
  static const std::regex header(R"(^op profile, stage (\d+) \(rank \d+\))");
  static const std::regex row(R"(^  (\w+) +(forward|backward) +([0-9.eE+-]+) +(\d+) +[0-9.]+%$)");
  static const std::regex total(R"(^  all ops +([0-9.eE+-]+) +[0-9.]+% of ([0-9.eE+-]+) s in steps$)");
  std::istringstream lines(log);
  PrintedProfile* current = nullptr;
  std::smatch match;
  for (std::string line; std::getline(lines, line);) {
    if (std::regex_search(line, match, header)) {
      current = &profiles[std::stoi(match[1].str())];
    } else if (current && std::regex_match(line, match, row)) {
      current->seconds[{match[1].str(), match[2].str()}] = std::stod(match[3].str());
    } else if (current && std::regex_match(line, match, total)) {
      current->all_ops = std::stod(match[1].str());
      current->step_seconds = std::stod(match[2].str());
      current = nullptr;
    }
  }
  return profiles;
}

testing::PartrainRun train(int ranks, const std::string& name, const std::string& extra) {
  const std::string directory = kRoot + "/" + name;
  std::filesystem::remove_all(directory);
  return testing::run_partrain(ranks,
                               "train " + std::string(PARTRAIN_SOURCE_DIR) + "/configs/gpt-tiny.toml" +
                                   " --set data.path=" + PARTRAIN_DATA_DIR + "/text.h5 --set train.steps=3" +
                                   " --set train.global_batch=4 --set profile.enabled=false --set checkpoint.every=0" +
                                   " --set log.trace='' --set log.dir=" + directory + extra,
                               directory + ".log");
}

void expect_consistent(const PrintedProfile& profile, double summed_step_seconds, const std::string& log) {
  ASSERT_FALSE(profile.seconds.empty()) << log;
  const double sum = std::accumulate(profile.seconds.begin(), profile.seconds.end(), 0.0,
                                     [](double total, const auto& entry) { return total + entry.second; });
  EXPECT_NEAR(profile.all_ops, sum, 1e-3 + 1e-3 * sum) << log;
  EXPECT_GT(sum, 0.0) << log;
  EXPECT_LE(sum, profile.step_seconds * 1.001 + 1e-3) << log;  // printed to 4 decimals
  EXPECT_NEAR(profile.step_seconds, summed_step_seconds, 1e-3 + 1e-3 * summed_step_seconds) << log;
}

TEST(OpProfile, OneRankNamesTheOpsAndFitsInTheSteps) {
  const testing::PartrainRun run = train(1, "one-rank", " --set log.op_profile=true");
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
  const std::map<int, PrintedProfile> profiles = printed_profiles(run.log);
  ASSERT_EQ(profiles.size(), 1u) << run.log;
  const PrintedProfile& profile = profiles.begin()->second;
  const std::vector<double> seconds = testing::metric_values(kRoot + "/one-rank", "seconds");
  ASSERT_EQ(seconds.size(), 3u);
  expect_consistent(profile, std::accumulate(seconds.begin(), seconds.end(), 0.0), run.log);
  for (const char* op : {"Gather", "LayerNorm", "Gemm", "Gelu", "SoftmaxCrossEntropy"})
    for (const char* direction : {"forward", "backward"})
      EXPECT_TRUE(profile.seconds.count({op, direction})) << op << " " << direction << "\n" << run.log;
}

TEST(OpProfile, TwoStagesPrintOneProfileEach) {
  const testing::PartrainRun run =
      train(2, "two-stages",
            " --set log.op_profile=true --set parallel.planner=manual --set parallel.stages=2"
            " --set 'parallel.boundaries=[\"h.1\"]'");
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
  const std::map<int, PrintedProfile> profiles = printed_profiles(run.log);
  ASSERT_EQ(profiles.size(), 2u) << run.log;
  for (const auto& [stage, profile] : profiles) {
    ASSERT_FALSE(profile.seconds.empty()) << run.log;
    EXPECT_LE(profile.all_ops, profile.step_seconds * 1.001 + 1e-3) << run.log;
  }
  EXPECT_TRUE(profiles.at(0).seconds.count({"Gather", "forward"})) << run.log;  // the embeddings: first stage
  EXPECT_FALSE(profiles.at(1).seconds.count({"Gather", "forward"})) << run.log;
  EXPECT_TRUE(profiles.at(1).seconds.count({"SoftmaxCrossEntropy", "backward"})) << run.log;  // the loss: last
}

TEST(OpProfile, OffByDefault) {
  const testing::PartrainRun run = train(1, "off", "");
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
  EXPECT_EQ(run.log.find("op profile"), std::string::npos) << run.log;
}

}  // namespace
}  // namespace partrain
