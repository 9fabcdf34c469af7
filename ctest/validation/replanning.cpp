// Re-planning during training (issue 26 item 3): a ProfileDB made wrong by 2× (every task set at
// microbatch sizes 1 and 2 priced at half its measured time) leads rannc to a plan of many small
// microbatches; after [profile] replan_window steps the run finds its step far from the prediction,
// corrects the profile with the stages' measured costs, plans again and switches to the new plan at
// a checkpoint, and the new plan measures faster than the first. Without the threshold (0) the
// same wrong profile is followed to the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/statistics.h"
#include "plan/plan.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 14;
constexpr int kWindow = 3;  // [profile] replan_window: steps 2..4 are compared, the switch follows step 4

std::string train_arguments(const std::string& directory, const std::string& cache, double threshold) {
  return "train " + std::string(PARTRAIN_SOURCE_DIR) + "/configs/gpt-tiny.toml --set train.steps=" +
         std::to_string(kSteps) + " --set parallel.planner=rannc --set checkpoint.every=0 --set log.dir=" + directory +
         " --set profile.cache_dir=" + cache + " --set profile.replan_window=" + std::to_string(kWindow) +
         " --set profile.replan_threshold=" + std::to_string(threshold) + " --set data.path=" +
         std::string(PARTRAIN_DATA_DIR) + "/text.h5";
}

// Halves the forward and backward time of every measurement at microbatch sizes 1 and 2 of the one
// ProfileDB in `cache`.
void halve_small_microbatches(const std::string& cache) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(cache))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u) << cache;
  nlohmann::json database = nlohmann::json::parse(std::ifstream(files[0]));
  int changed = 0;
  for (nlohmann::json& measurement : database.at("measurements"))
    if (measurement.at("batch").get<int>() <= 2) {
      measurement["forward_seconds"] = 0.5 * measurement.at("forward_seconds").get<double>();
      measurement["backward_seconds"] = 0.5 * measurement.at("backward_seconds").get<double>();
      ++changed;
    }
  ASSERT_GT(changed, 0);
  std::ofstream(files[0]) << database.dump();
}

TEST(Replanning, AProfileWrongByTwoIsCorrectedAndTheNewPlanMeasuresFaster) {
  const std::string root = std::string(PARTRAIN_RUN_DIR) + "/replanning-" + std::to_string(::getpid());
  const std::string cache = root + "/cache";
  fs::remove_all(root);
  // A first short run fills the profile cache (no re-planning).
  const testing::PartrainRun fill = testing::run_partrain(
      2, train_arguments(root + "/fill", cache, 0.0) + " --set train.steps=1", root + "/fill.log");
  ASSERT_EQ(fill.status, 0) << fill.command << "\n" << fill.log;
  halve_small_microbatches(cache);

  // Threshold 0: the wrong plan is kept, and no row speaks of re-planning.
  const testing::PartrainRun kept = testing::run_partrain(2, train_arguments(root + "/kept", cache, 0.0) +
                                                                  " --set train.steps=6", root + "/kept.log");
  ASSERT_EQ(kept.status, 0) << kept.command << "\n" << kept.log;
  EXPECT_EQ(kept.log.find("replan:"), std::string::npos) << kept.log;
  const Plan wrong = Plan::load(root + "/kept/plan.json");
  ASSERT_LE(wrong.microbatch_size() / wrong.stages.front().replicas, 2)
      << "the halved profile no longer leads rannc to microbatches of 1-2 samples per replica: the test's premise";

  const std::string directory = root + "/replanned";
  const testing::PartrainRun run = testing::run_partrain(2, train_arguments(directory, cache, 0.15), directory + ".log");
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
  EXPECT_NE(run.log.find("replan: step time measured"), std::string::npos) << run.log;
  EXPECT_NE(run.log.find("switching to it at the next checkpoint"), std::string::npos) << run.log;
  ASSERT_TRUE(fs::exists(directory + "/plan-before-replan.json"));
  const Plan first = Plan::load(directory + "/plan-before-replan.json");
  const Plan second = Plan::load(directory + "/plan.json");
  EXPECT_NE(first.microbatches, second.microbatches) << "the switch changed nothing";

  // The metrics: one row per step, the re-planning recorded on step kWindow + 1's row.
  std::vector<nlohmann::json> rows;
  std::ifstream metrics(directory + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(kSteps));
  for (int k = 0; k < kSteps; ++k) EXPECT_EQ(rows[k].at("step").get<int>(), k + 1);
  const nlohmann::json& record = rows[kWindow].at("replan");
  EXPECT_TRUE(record.at("replanned").get<bool>());
  EXPECT_TRUE(record.at("switched").get<bool>());
  EXPECT_EQ(record.at("switch_after_step").get<int>(), kWindow + 1);
  EXPECT_GT(record.at("error").get<double>(), 0.15);

  // The window's steps under the first plan against the second plan's (after its own first step).
  std::vector<double> before, after;
  for (int k = 1; k <= kWindow; ++k) before.push_back(rows[k].at("seconds").get<double>());
  for (int k = kWindow + 2; k < kSteps; ++k) after.push_back(rows[k].at("seconds").get<double>());
  EXPECT_LT(median(after), median(before)) << "the re-planned run is not faster than the wrong plan";
  // Training went on from the checkpoint: the loss keeps falling across the switch.
  EXPECT_LT(rows.back().at("loss").get<double>(), rows[kWindow].at("loss").get<double>());
}

}  // namespace
}  // namespace partrain
