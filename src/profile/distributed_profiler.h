#pragma once
// Distributed profiling (docs/planning.md §Profiling): rank 0 decides what to measure, every rank
// measures its share on its own device, rank 0 gathers the results into the ProfileDB and every rank
// gets the merged DB.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "graph/graph.h"
#include "profile/profile_db.h"
#include "profile/profile_request.h"
#include "profile/profiler.h"

namespace partrain::profile {

/// What profile_distributed did; identical on every rank except `measured_here`.
struct DistributedProfileReport {
  /// The requests that were measured: rank 0's list without duplicates and without those already
  /// in rank 0's DB, in rank 0's order.
  std::vector<ProfileRequest> requests;
  /// The rank that measured each of `requests`.
  std::vector<int> owner;
  /// Indices into `requests` measured by this rank.
  std::vector<std::size_t> measured_here;
};

/// Estimated cost of a request, used only to balance the ranks' shares: Σ over its tasks of
/// (forward FLOPs + output bytes) × batch (× 1 for constant tasks), plus 1.
double estimated_request_cost(const Graph& graph, const ProfileRequest& request);

/// Assigns requests to `ranks` ranks, longest-processing-time first: requests by decreasing
/// estimated cost (ties by index) each go to the rank with the least estimated load so far (ties to
/// the lowest rank). Returns the rank of each request. Deterministic. Throws partrain::Error for
/// ranks < 1.
std::vector<int> assign_requests(const Graph& graph, std::span<const ProfileRequest> requests, int ranks);

/// Measures `requests` across the ranks of `world`. Collective: every rank of `world` calls it.
/// Only rank 0's `requests` and `db` matter: rank 0 drops the requests already in its DB (and
/// duplicates) and broadcasts the rest; each rank measures its share (assign_requests) on `backend`
/// with measure_task_set; rank 0 gathers the results and merges them into its DB; then rank 0's DB
/// is broadcast and replaces `db` on every other rank. `progress` (may be empty) is called on rank 0
/// only, with the fraction (0..1) of rank 0's own share measured so far, and with 1 at the end.
/// Throws partrain::Error on every rank when rank 0's DB belongs to another graph (graph hash) or a
/// measurement failed on any rank (the message names the rank and the request).
DistributedProfileReport profile_distributed(const Graph& graph, std::vector<ProfileRequest> requests,
                                             comm::Communicator& world, Backend& backend,
                                             const ProfilerOptions& options, ProfileDB& db,
                                             const std::function<void(double)>& progress = {});

}  // namespace partrain::profile
