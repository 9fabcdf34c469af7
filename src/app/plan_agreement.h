#pragma once
// The plan every rank runs, agreed on collectively: profiled (or analytic) costs, rank 0 plans or
// loads a saved plan, every rank gets the same Plan. Shared by `partrain train` and `partrain eval`.
#include <string>

#include "app/planning.h"
#include "comm/communicator.h"
#include "core/backend.h"
#include "graph/graph.h"
#include "io/config.h"
#include "plan/plan.h"
#include "profile/profile_db.h"

namespace partrain::app {

/// The ProfileDB cache file of `graph` for this run: [profile] cache_dir, the graph's hash, the
/// backend (with ranks per node and threads on the CPU) and [train] precision. Collective over
/// MPI_COMM_WORLD (it asks how many ranks share the node): every rank calls it.
std::string profile_cache_path(const ExperimentConfig& config, const Graph& graph, const Backend& backend);

/// Rank 0 loads `plan_file` (when non-empty; checked against `config` and the world size) or plans
/// graphs.model() in three dimensions with [parallel] planner for world.size()
/// ranks (plan_experiment: [parallel] tensor_parallel and zero fixed or "auto"), on the layers
/// profiled over every rank (when `profile` and [profile] enabled: the graph of every tensor-parallel
/// degree the planner may choose is profiled; the ProfileDB cache in [profile] cache_dir is reused
/// and extended) or on the analytic cost model, and broadcasts the plan. The plan's stages index
/// graphs.of_degree(plan.tensor_parallel), which this builds (once) where it needs it: on rank 0,
/// and on every rank for the degrees profiled. A planning error on rank 0 becomes the same
/// partrain::Error on every rank. Collective over `world` (and `device_world`, the communicator
/// training runs on, whose costs profiling measures). `corrected_profile` (every rank passes one of
/// the same graph hash; rank 0's holds the measurements): the costs of that graph, used as they are
/// instead of profiling it (re-planning during training, app/replanning.h).
Plan agree_on_plan(const ExperimentConfig& config, PlannedGraphs& graphs, const std::string& plan_file, bool profile,
                   comm::Communicator& world, comm::Communicator& device_world, Backend& backend,
                   const profile::ProfileDB* corrected_profile = nullptr);

}  // namespace partrain::app
