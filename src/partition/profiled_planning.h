#pragma once
// Planning with measured costs when what the planner will ask for is not known in advance
// (DESIGN.md "Profiling"): the planner runs on a cost model that answers from a ProfileDB and, for
// task sets not in it, from the analytic model while recording each such miss; the misses are then
// measured (e.g. by profile_distributed) and the planner runs again, until a round asks for nothing
// new. Independent of runtime/ and comm/: measuring is the caller's callback.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "partition/cost_model.h"
#include "plan/plan.h"
#include "partition/planner.h"
#include "profile/profile_db.h"
#include "profile/profile_request.h"

namespace partrain::partition {

/// A CostModel that answers from a ProfileDB and, for (task set, batch) pairs not in it, from the
/// analytic model (make_analytic_cost_model), recording each such miss once. Thread-safe. The DB
/// must outlive the model and belong to the graph (same graph hash, else partrain::Error); entries
/// added to the DB later are seen by later calls.
class RecordingCostModel final : public CostModel {
 public:
  RecordingCostModel(const Graph& graph, const profile::ProfileDB& database, const DeviceSpec& device);

  /// The DB's measurement, or the analytic figures (a miss, recorded) when it has none.
  profile::Measurement measure(std::span<const int> tasks, std::int64_t batch) const override;
  double transfer_seconds(double bytes, bool across_nodes) const override;
  double allreduce_seconds(double bytes, int replicas, bool across_nodes) const override;
  /// Names the DB, its size and the number of misses answered analytically so far.
  std::string description() const override;
  const DeviceSpec& device() const override;

  /// The misses so far, each (task set, batch) once, in the order first asked; task ids sorted.
  std::vector<profile::ProfileRequest> misses() const;
  /// Number of measure() calls answered from the DB.
  std::size_t hits() const;

 private:
  const profile::ProfileDB& database_;
  std::unique_ptr<CostModel> analytic_;
  mutable std::mutex mutex_;
  mutable std::vector<profile::ProfileRequest> misses_;
  mutable std::set<std::pair<std::string, std::int64_t>> missed_;
  mutable std::size_t hits_ = 0;
};

/// What plan_with_profiling did.
struct ProfiledPlanningReport {
  int rounds = 0;                                  // planner runs
  std::vector<std::size_t> misses_per_round;       // task sets each run asked for that the DB lacked
  /// Misses of the last run (empty when the plan is fully profiled): their costs are analytic.
  std::vector<profile::ProfileRequest> remaining_misses;
};

/// Plans with measured costs: runs make_plan(graph, RecordingCostModel(db), options); while the run
/// asked for task sets the DB lacks, calls `measure(misses)` — which must add them to `db` (e.g.
/// with profile::profile_distributed) — and plans again, at most `max_rounds` runs in all. Stops
/// early when `measure` added none of the misses. Returns the last plan. If its run still had
/// misses (max_rounds reached, or `measure` could not fill them), those task sets were costed by the
/// analytic model; `report` (may be null) lists them. In a distributed run where `measure` is
/// collective, every rank calls this with the same DB (profile_distributed leaves it identical) and
/// so plans identically and calls `measure` the same number of times.
/// Throws partrain::Error for max_rounds < 1, a DB of another graph, or what make_plan / measure throw.
Plan plan_with_profiling(const Graph& graph, const PlannerOptions& options, const DeviceSpec& device,
                         profile::ProfileDB& db,
                         const std::function<void(const std::vector<profile::ProfileRequest>&)>& measure,
                         int max_rounds = 3, ProfiledPlanningReport* report = nullptr);

}  // namespace partrain::partition
