#include "profile/distributed_profiler.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace partrain::profile {

namespace {

std::string describe(const ProfileRequest& request) {
  std::ostringstream text;
  text << "tasks " << task_set_key(request.tasks) << " at batch " << request.batch;
  return text.str();
}

nlohmann::json requests_to_json(const std::vector<ProfileRequest>& requests) {
  nlohmann::json list = nlohmann::json::array();
  for (const ProfileRequest& request : requests) list.push_back({{"tasks", request.tasks}, {"batch", request.batch}});
  return list;
}

std::vector<ProfileRequest> requests_from_json(const nlohmann::json& list) {
  std::vector<ProfileRequest> requests;
  for (const nlohmann::json& entry : list)
    requests.push_back({entry.at("tasks").get<std::vector<int>>(), entry.at("batch").get<std::int64_t>()});
  return requests;
}

nlohmann::json parse(const std::string& bytes, const char* what) {
  try {
    return nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& error) {
    PARTRAIN_FAIL("distributed profiling: malformed " << what << " message: " << error.what());
  }
}

}  // namespace

double estimated_request_cost(const Graph& graph, const ProfileRequest& request) {
  const double batch = static_cast<double>(request.batch);
  double cost = 1.0;
  for (int id : request.tasks) {
    const Task& task = graph.task(id);
    cost += (task.cost.forward_flops + task.cost.activation_bytes) * (task.constant ? 1.0 : batch);
  }
  return cost;
}

std::vector<int> assign_requests(const Graph& graph, std::span<const ProfileRequest> requests, int ranks) {
  PARTRAIN_CHECK(ranks >= 1, "assign_requests: need at least one rank, not " << ranks);
  std::vector<double> cost(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) cost[i] = estimated_request_cost(graph, requests[i]);
  std::vector<std::size_t> order(requests.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  std::vector<int> owner(requests.size(), 0);
  for (std::size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // first minimum: lowest rank
    owner[i] = static_cast<int>(least - load.begin());
    *least += cost[i];
  }
  return owner;
}

DistributedProfileReport profile_distributed(const Graph& graph, std::vector<ProfileRequest> requests,
                                             comm::Communicator& world, Backend& backend,
                                             const ProfilerOptions& options, ProfileDB& db,
                                             const std::function<void(double)>& progress) {
  const int rank = world.rank();
  const int size = world.size();
  const std::uint64_t hash = graph.hash();

  // 1. Rank 0 decides what is still missing and broadcasts it (or the reason it cannot).
  std::string message;
  if (rank == 0) {
    nlohmann::json document;
    if (db.graph_hash() != hash) {
      std::ostringstream error;
      error << "distributed profiling: the profile database belongs to another model (graph hash " << std::hex
            << db.graph_hash() << ", this model " << hash << ")";
      document = {{"error", error.str()}};
    } else {
      std::vector<ProfileRequest> missing;
      std::set<std::pair<std::string, std::int64_t>> seen;
      for (ProfileRequest& request : requests) {
        if (db.find(request.tasks, request.batch) != nullptr) continue;
        if (!seen.emplace(task_set_key(request.tasks), request.batch).second) continue;
        missing.push_back(std::move(request));
      }
      document = {{"backend", db.backend()}, {"dtype", db.dtype()}, {"requests", requests_to_json(missing)}};
    }
    message = document.dump();
  }
  world.broadcast_bytes(message, 0);
  const nlohmann::json plan = parse(message, "request list");
  if (plan.contains("error")) PARTRAIN_FAIL(plan.at("error").get<std::string>());

  DistributedProfileReport report;
  report.requests = requests_from_json(plan.at("requests"));
  report.owner = assign_requests(graph, report.requests, size);

  // 2. Every rank measures its share; a failure is reported instead of results, so no rank hangs.
  ProfileDB local(hash, plan.at("backend").get<std::string>(), plan.at("dtype").get<std::string>());
  std::string failure;
  std::size_t own_total = 0;
  for (int owner : report.owner) own_total += owner == rank ? 1 : 0;
  if (rank == 0 && progress) progress(0.0);
  for (std::size_t i = 0; i < report.requests.size() && failure.empty(); ++i) {
    if (report.owner[i] != rank) continue;
    const ProfileRequest& request = report.requests[i];
    try {
      local.insert(request.tasks, request.batch, measure_task_set(graph, request.tasks, request.batch, backend, options));
      report.measured_here.push_back(i);
    } catch (const std::exception& error) {
      failure = "rank " + std::to_string(rank) + ", " + describe(request) + ": " + error.what();
    }
    if (rank == 0 && progress) progress(static_cast<double>(report.measured_here.size()) / static_cast<double>(own_total));
  }

  // 3. Gather to rank 0, merge, broadcast the merged DB (or every failure).
  const nlohmann::json mine = failure.empty() ? nlohmann::json{{"db", local.to_json()}} : nlohmann::json{{"error", failure}};
  const std::vector<std::string> gathered = world.gather_bytes(mine.dump(), 0);
  std::string result;
  if (rank == 0) {
    std::string errors;
    ProfileDB merged = db;
    for (std::size_t r = 0; r < gathered.size(); ++r) {
      try {
        const nlohmann::json part = parse(gathered[r], "result");
        if (part.contains("error")) {
          errors += (errors.empty() ? "" : "; ") + part.at("error").get<std::string>();
          continue;
        }
        merged.merge(ProfileDB::from_json(part.at("db"), "results of rank " + std::to_string(r)));
      } catch (const std::exception& error) {
        errors += (errors.empty() ? "" : "; ") + std::string(error.what());
      }
    }
    if (errors.empty()) {
      db = std::move(merged);
      result = nlohmann::json{{"db", db.to_json()}}.dump();
    } else {
      result = nlohmann::json{{"error", "distributed profiling failed: " + errors}}.dump();
    }
  }
  world.broadcast_bytes(result, 0);
  const nlohmann::json outcome = parse(result, "profile database");
  if (outcome.contains("error")) PARTRAIN_FAIL(outcome.at("error").get<std::string>());
  if (rank != 0) db = ProfileDB::from_json(outcome.at("db"), "profile database from rank 0");
  if (rank == 0 && progress) progress(1.0);
  return report;
}

}  // namespace partrain::profile
