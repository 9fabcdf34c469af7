// MPI tests of profile::profile_distributed (run under mpiexec with 2, 3 and 4 ranks; see
// ctest/CMakeLists.txt): rank 0's requests are measured across the ranks, each by exactly one rank,
// and every rank ends with rank 0's merged ProfileDB. Every rank runs every test and makes the same
// collective calls (EXPECT_*, no early return between collectives) so a failure cannot hang others.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"
#include "profile/distributed_profiler.h"
#include "support/errors.h"
#include "support/mpi_test_main.h"
#include "support/tiny_models.h"

namespace partrain::profile {
namespace {

using testing::error_message;

comm::Communicator& world() { return testing::mpi_world(); }

const Graph& bert() {
  static const Graph graph = build_model(testing::tiny_model_config("bert"));
  return graph;
}

std::vector<int> tasks_with_prefix(const std::string& prefix) {
  std::vector<int> ids;
  for (const Task& task : bert().tasks())
    if (task.name.starts_with(prefix)) ids.push_back(task.id);
  return ids;
}

std::vector<int> layer_tasks(int layer) { return tasks_with_prefix("bert.encoder.layer." + std::to_string(layer) + "."); }

ProfilerOptions quick() {
  ProfilerOptions options;
  options.warmup = 0;
  options.repeats = 1;
  return options;
}

// Rank 0's list: each layer at batch 1 and 2 (plus a duplicate); other ranks pass something else,
// which must be ignored.
std::vector<ProfileRequest> layer_requests() {
  if (world().rank() != 0) return {{tasks_with_prefix("cls."), 3}};
  std::vector<ProfileRequest> requests;
  for (int layer = 0; layer < 2; ++layer)
    for (std::int64_t batch : {1, 2}) requests.push_back({layer_tasks(layer), batch});
  requests.push_back(requests.front());
  return requests;
}

TEST(DistributedProfiler, EachRequestMeasuredByOneRankAndEveryRankGetsTheDb) {
  ProfileDB db(bert().hash(), "cpu", "fp32");
  std::vector<double> fractions;
  const DistributedProfileReport report =
      profile_distributed(bert(), layer_requests(), world(), cpu_backend(), quick(), db,
                          [&](double fraction) { fractions.push_back(fraction); });

  ASSERT_EQ(report.requests.size(), 4u);  // the duplicate dropped
  ASSERT_EQ(report.owner.size(), 4u);
  EXPECT_EQ(report.owner, assign_requests(bert(), report.requests, world().size()));

  // Each request measured by exactly one rank: the one assign_requests named.
  const std::vector<std::string> measured =
      world().all_gather_bytes(nlohmann::json(report.measured_here).dump());
  std::vector<int> times_measured(report.requests.size(), 0);
  for (int r = 0; r < world().size(); ++r) {
    for (std::size_t index : nlohmann::json::parse(measured[static_cast<std::size_t>(r)]).get<std::vector<std::size_t>>()) {
      ASSERT_LT(index, report.requests.size());
      ++times_measured[index];
      EXPECT_EQ(report.owner[index], r) << "request " << index;
    }
  }
  for (std::size_t i = 0; i < times_measured.size(); ++i) EXPECT_EQ(times_measured[i], 1) << "request " << i;
  // With at least as many requests as ranks, every rank gets work.
  EXPECT_FALSE(report.measured_here.empty());

  // Rank 0's db holds every request; every rank holds the same db.
  EXPECT_EQ(db.size(), 4u);
  for (int layer = 0; layer < 2; ++layer) {
    for (std::int64_t batch : {1, 2}) {
      const Measurement* m = db.find(layer_tasks(layer), batch);
      if (m == nullptr) {
        ADD_FAILURE() << "missing: layer " << layer << " batch " << batch;
        continue;
      }
      EXPECT_GT(m->forward_seconds, 0.0);
      EXPECT_GT(m->backward_seconds, 0.0);
      EXPECT_DOUBLE_EQ(m->boundary_input_bytes, 4.0 * 128 * 64 * batch);
    }
  }
  const std::string text = db.to_json().dump();
  const std::vector<std::string> everyone = world().all_gather_bytes(text);
  for (int r = 0; r < world().size(); ++r) EXPECT_EQ(everyone[static_cast<std::size_t>(r)], everyone[0]) << "rank " << r;

  if (world().rank() == 0) {
    EXPECT_FALSE(fractions.empty());
    if (!fractions.empty()) {
      EXPECT_DOUBLE_EQ(fractions.back(), 1.0);
    }
    for (std::size_t i = 1; i < fractions.size(); ++i) EXPECT_GE(fractions[i], fractions[i - 1]);
  } else {
    EXPECT_TRUE(fractions.empty());
  }

  // A second call measures only what rank 0's db lacks.
  std::vector<ProfileRequest> more = layer_requests();
  if (world().rank() == 0) more.push_back({tasks_with_prefix("bert.embeddings."), 1});
  const DistributedProfileReport second = profile_distributed(bert(), more, world(), cpu_backend(), quick(), db);
  ASSERT_EQ(second.requests.size(), 1u);
  EXPECT_EQ(second.requests[0].tasks, tasks_with_prefix("bert.embeddings."));
  EXPECT_EQ(db.size(), 5u);
  // What was measured before is kept.
  const ProfileDB before = ProfileDB::from_json(nlohmann::json::parse(text), "first db");
  ASSERT_NE(db.find(layer_tasks(0), 1), nullptr);
  EXPECT_EQ(db.find(layer_tasks(0), 1)->forward_seconds, before.find(layer_tasks(0), 1)->forward_seconds);
}

TEST(DistributedProfiler, FailuresReachEveryRank) {
  // A DB of another graph on rank 0.
  ProfileDB wrong(world().rank() == 0 ? bert().hash() + 1 : bert().hash(), "cpu", "fp32");
  EXPECT_NE(error_message([&] { profile_distributed(bert(), layer_requests(), world(), cpu_backend(), quick(), wrong); })
                .find("another model"),
            std::string::npos);

  // A request that cannot be measured (not convex) on whichever rank gets it.
  std::vector<int> gap = layer_tasks(0);
  gap.pop_back();
  const std::vector<int> one = layer_tasks(1);
  gap.insert(gap.end(), one.begin(), one.end());
  ProfileDB db(bert().hash(), "cpu", "fp32");
  const std::string message =
      error_message([&] { profile_distributed(bert(), {{gap, 1}}, world(), cpu_backend(), quick(), db); });
  EXPECT_NE(message.find("distributed profiling failed: rank "), std::string::npos) << message;
  EXPECT_EQ(db.size(), 0u);
}

}  // namespace
}  // namespace partrain::profile
