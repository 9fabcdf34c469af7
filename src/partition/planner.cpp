#include "partition/planner.h"

#include "core/error.h"
#include "partition/graph_workload.h"

namespace partrain::partition {

// Interim dispatch while the other planners land (replaced by the full dispatch).
Plan make_plan(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const std::string& name = options.planner;
  PARTRAIN_CHECK(name == "ideals" || name == "dpl", "planner '" << name << "' is not available yet");
  Plan plan = plan_tarnawski(graph, cost, options, name == "dpl");
  plan.validate(graph);
  return plan;
}

}  // namespace partrain::partition
