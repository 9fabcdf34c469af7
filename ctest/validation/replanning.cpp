// Re-planning during training (issue 26 item 3): a ProfileDB made wrong by 2× (every task set at
// microbatch size 1 priced at half its measured time) leads rannc to a plan of one-sample
// microbatches; after [profile] replan_window steps the run finds its step far from the prediction,
// corrects the profile with the stages' measured costs, plans again and switches to the new plan at
// a checkpoint, and the new plan measures faster than the first. Without the threshold (0) the
// same wrong profile is followed to the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
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

// Halves the forward and backward time of every measurement at microbatch size 1 of the one ProfileDB
// in `cache`. Only size 1: one-sample microbatches run measurably slower per sample than larger ones
// on every machine seen (per-microbatch overheads), while sizes 2 to 8 can run alike, so a plan
// moved from size 2 to 8 need not measure faster.
void halve_one_sample_microbatches(const std::string& cache) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(cache))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u) << cache;
  nlohmann::json database = nlohmann::json::parse(std::ifstream(files[0]));
  int changed = 0;
  for (nlohmann::json& measurement : database.at("measurements"))
    if (measurement.at("batch").get<int>() == 1) {
      measurement["forward_seconds"] = 0.5 * measurement.at("forward_seconds").get<double>();
      measurement["backward_seconds"] = 0.5 * measurement.at("backward_seconds").get<double>();
      ++changed;
    }
  ASSERT_GT(changed, 0);
  std::ofstream(files[0]) << database.dump();
}

// The metrics rows of a run's metrics.jsonl, one per step.
std::vector<nlohmann::json> metrics_rows(const std::string& directory) {
  std::vector<nlohmann::json> rows;
  std::ifstream metrics(directory + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// Median step seconds of the window under the first plan, and of the second plan's steps after its
// own first one.
std::pair<double, double> seconds_before_and_after(const std::vector<nlohmann::json>& rows) {
  std::vector<double> before, after;
  for (int k = 1; k <= kWindow; ++k) before.push_back(rows[k].at("seconds").get<double>());
  for (int k = kWindow + 2; k < kSteps; ++k) after.push_back(rows[k].at("seconds").get<double>());
  return {median(before), median(after)};
}

// One try: a profile cache filled by a short run, made wrong, and a run that re-plans on it.
struct Attempt {
  std::string directory;  // the re-planning run's log.dir
  testing::PartrainRun run;
  std::string retry_reason;  // empty: the switch happened and measured faster
};

Attempt attempt_replanning(const std::string& root) {
  const std::string cache = root + "/cache";
  fs::remove_all(root);
  Attempt attempt;
  // A first short run fills the profile cache (no re-planning).
  const testing::PartrainRun fill = testing::run_partrain(
      2, train_arguments(root + "/fill", cache, 0.0) + " --set train.steps=1", root + "/fill.log");
  EXPECT_EQ(fill.status, 0) << fill.command << "\n" << fill.log;
  if (fill.status != 0) return attempt;
  halve_one_sample_microbatches(cache);

  // Threshold 0: the wrong plan is kept, and no row speaks of re-planning.
  const testing::PartrainRun kept = testing::run_partrain(2, train_arguments(root + "/kept", cache, 0.0) +
                                                                  " --set train.steps=6", root + "/kept.log");
  EXPECT_EQ(kept.status, 0) << kept.command << "\n" << kept.log;
  if (kept.status != 0) return attempt;
  EXPECT_EQ(kept.log.find("replan:"), std::string::npos) << kept.log;
  // The test's premise; a profile timed while the machine's speed changed can miss it.
  const Plan wrong = Plan::load(root + "/kept/plan.json");
  if (const int samples = wrong.microbatch_size() / wrong.stages.front().replicas; samples != 1) {
    attempt.retry_reason = "the halved profile led rannc to microbatches of " + std::to_string(samples) +
                           " samples per replica, not 1 (the test's premise)";
    return attempt;
  }

  attempt.directory = root + "/replanned";
  attempt.run = testing::run_partrain(2, train_arguments(attempt.directory, cache, 0.15), attempt.directory + ".log");
  if (attempt.run.status != 0) return attempt;
  // The machine's speed can change between profiling and training (a shared VM's neighbours: its
  // speed calibration was seen to move by 1.7x between two runs): the corrected profile then
  // misprices the sizes that did not run, and the one re-plan may keep the plan or move to one no
  // faster. That is measured again; a broken re-plan path fails every try.
  if (attempt.run.log.find("switching to it at the next checkpoint") == std::string::npos)
    attempt.retry_reason = "no switch";
  else if (const std::vector<nlohmann::json> rows = metrics_rows(attempt.directory); rows.size() != kSteps)
    return attempt;  // the assertions below say what is missing
  else if (const auto [before, after] = seconds_before_and_after(rows); !(after < before))
    attempt.retry_reason = "switched, but measured " + std::to_string(after) + " s after against " +
                           std::to_string(before) + " s before";
  return attempt;
}

TEST(Replanning, AProfileWrongByTwoIsCorrectedAndTheNewPlanMeasuresFaster) {
  constexpr int kAttempts = 3;
  Attempt attempt;
  for (int n = 1; n <= kAttempts; ++n) {
    attempt = attempt_replanning(std::string(PARTRAIN_RUN_DIR) + "/replanning-" + std::to_string(::getpid()) + "-" +
                                 std::to_string(n));
    if (::testing::Test::HasFailure() || attempt.retry_reason.empty()) break;
    std::printf("attempt %d of %d: %s; measuring again\n%s\n", n, kAttempts, attempt.retry_reason.c_str(),
                attempt.run.log.c_str());
  }
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_TRUE(attempt.retry_reason.empty()) << "every attempt missed; the last: " << attempt.retry_reason << "\n"
                                            << attempt.run.log;
  const std::string& directory = attempt.directory;
  const testing::PartrainRun& run = attempt.run;
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
  EXPECT_NE(run.log.find("replan: step time measured"), std::string::npos) << run.log;
  EXPECT_NE(run.log.find("switching to it at the next checkpoint"), std::string::npos) << run.log;
  ASSERT_TRUE(fs::exists(directory + "/plan-before-replan.json")) << run.log;
  const Plan first = Plan::load(directory + "/plan-before-replan.json");
  const Plan second = Plan::load(directory + "/plan.json");
  EXPECT_NE(first.microbatches, second.microbatches) << "the switch changed nothing";

  // The metrics: one row per step, the re-planning recorded on step kWindow + 1's row.
  const std::vector<nlohmann::json> rows = metrics_rows(directory);
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(kSteps));
  for (int k = 0; k < kSteps; ++k) EXPECT_EQ(rows[k].at("step").get<int>(), k + 1);
  const nlohmann::json& record = rows[kWindow].at("replan");
  EXPECT_TRUE(record.at("replanned").get<bool>());
  EXPECT_TRUE(record.at("switched").get<bool>());
  EXPECT_EQ(record.at("switch_after_step").get<int>(), kWindow + 1);
  EXPECT_GT(record.at("error").get<double>(), 0.15);

  // The window's steps under the first plan against the second plan's (after its own first step).
  const auto [before, after] = seconds_before_and_after(rows);
  EXPECT_LT(after, before) << "the re-planned run is not faster than the wrong plan";
  // Training went on from the checkpoint: the loss keeps falling across the switch.
  EXPECT_LT(rows.back().at("loss").get<double>(), rows[kWindow].at("loss").get<double>());
}

}  // namespace
}  // namespace partrain
