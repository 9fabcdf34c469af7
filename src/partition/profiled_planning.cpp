#include "partition/profiled_planning.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace partrain::partition {

RecordingCostModel::RecordingCostModel(const Graph& graph, const profile::ProfileDB& database,
                                       const DeviceSpec& device)
    : database_(database), analytic_(make_analytic_cost_model(graph, device)) {
  const std::uint64_t hash = graph.hash();
  PARTRAIN_CHECK(database.graph_hash() == hash, "profiled planning: the profile database belongs to another model (graph hash "
                                                    << std::hex << database.graph_hash() << ", this model " << hash
                                                    << ")");
}

profile::Measurement RecordingCostModel::measure(std::span<const int> tasks, std::int64_t batch) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const profile::Measurement* found = database_.find(tasks, batch)) {
      ++hits_;
      return *found;
    }
    if (missed_.emplace(profile::task_set_key(tasks), batch).second) {
      std::vector<int> sorted(tasks.begin(), tasks.end());
      std::sort(sorted.begin(), sorted.end());
      sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
      misses_.push_back({std::move(sorted), batch});
    }
  }
  return analytic_->measure(tasks, batch);
}

double RecordingCostModel::transfer_seconds(double bytes, bool across_nodes) const {
  return analytic_->transfer_seconds(bytes, across_nodes);
}

double RecordingCostModel::allreduce_seconds(double bytes, int replicas, bool across_nodes) const {
  return analytic_->allreduce_seconds(bytes, replicas, across_nodes);
}

std::string RecordingCostModel::description() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream text;
  text << "profiled (" << database_.backend() << ", " << database_.dtype() << ", " << database_.size()
       << " measurements)";
  if (!misses_.empty()) text << ", " << misses_.size() << " task sets analytic: " << analytic_->description();
  return text.str();
}

const DeviceSpec& RecordingCostModel::device() const { return analytic_->device(); }

std::vector<profile::ProfileRequest> RecordingCostModel::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

std::size_t RecordingCostModel::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

Plan plan_with_profiling(const Graph& graph, const PlannerOptions& options, const DeviceSpec& device,
                         profile::ProfileDB& db,
                         const std::function<void(const std::vector<profile::ProfileRequest>&)>& measure,
                         int max_rounds, ProfiledPlanningReport* report) {
  PARTRAIN_CHECK(max_rounds >= 1, "profiled planning: max_rounds must be >= 1, not " << max_rounds);
  ProfiledPlanningReport local;
  ProfiledPlanningReport& out = report ? *report : local;
  out = {};
  for (int round = 1;; ++round) {
    const RecordingCostModel cost(graph, db, device);
    Plan plan = make_plan(graph, cost, options);
    std::vector<profile::ProfileRequest> misses = cost.misses();
    out.rounds = round;
    out.misses_per_round.push_back(misses.size());
    if (misses.empty() || round == max_rounds || !measure) {
      out.remaining_misses = std::move(misses);
      return plan;
    }
    measure(misses);
    const bool progressed = std::any_of(misses.begin(), misses.end(), [&](const profile::ProfileRequest& request) {
      return db.find(request.tasks, request.batch) != nullptr;
    });
    if (!progressed) {  // planning again would ask for the same sets: this plan is the answer
      out.remaining_misses = std::move(misses);
      return plan;
    }
  }
}

}  // namespace partrain::partition
