// The manual planner: boundaries and replicas from the configuration. See manual.h.
#include "partition/baselines/manual.h"

#include <sstream>

#include "core/error.h"

namespace partrain::partition {

namespace {

std::string layer_list(const std::vector<LayerGroup>& groups) {
  std::ostringstream out;
  for (std::size_t g = 0; g < groups.size(); ++g) out << (g ? ", " : "") << groups[g].name;
  return out.str();
}

}  // namespace

std::vector<std::pair<std::size_t, std::size_t>> manual_stage_ranges(const std::vector<LayerGroup>& groups,
                                                                     const std::vector<std::string>& boundaries) {
  PARTRAIN_CHECK(!groups.empty(), "[parallel] boundaries: the model has no layers");
  std::vector<std::size_t> starts{0};
  for (std::size_t b = 0; b < boundaries.size(); ++b) {
    const std::string& name = boundaries[b];
    std::size_t found = groups.size();
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (groups[g].name == name) found = g;
    PARTRAIN_CHECK(found < groups.size(), "[parallel] boundaries: '" << name << "' is not a layer of this model; layers are: "
                                                                    << layer_list(groups));
    PARTRAIN_CHECK(found > 0, "[parallel] boundaries: '" << name << "' is the first layer, so stage 1 would be empty");
    PARTRAIN_CHECK(found > starts.back(),
                   "[parallel] boundaries: '" << name << "' (boundary " << b + 1 << ") does not come after '"
                                              << groups[starts.back()].name
                                              << "'; boundaries must name layers in pipeline order, each once");
    starts.push_back(found);
  }
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (std::size_t s = 0; s < starts.size(); ++s)
    ranges.emplace_back(starts[s], s + 1 < starts.size() ? starts[s + 1] : groups.size());
  return ranges;
}

Plan plan_manual(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const std::vector<std::pair<std::size_t, std::size_t>> ranges = manual_stage_ranges(groups, options.boundaries);
  // Interleaved: the boundaries cut S·v model chunks; chunk c runs on pipeline stage c mod S.
  const int v = schedule_has_chunks(options.schedule) ? std::max(1, options.virtual_stages) : 1;
  const int chunks = static_cast<int>(ranges.size());
  PARTRAIN_CHECK(chunks % v == 0 && (v == 1 || chunks / v >= 2),
                 "[parallel] boundaries: " << options.boundaries.size() << " boundaries make " << chunks
                                           << " model chunks, but virtual_stages = " << v
                                           << " needs stages x " << v << " chunks on at least 2 stages, i.e. "
                                           << "stages x virtual_stages - 1 boundaries");
  const int stages = chunks / v;
  PARTRAIN_CHECK(options.stages <= 0 || options.stages == stages,
                 "[parallel] stages = " << options.stages << " but boundaries name " << options.boundaries.size()
                                        << " boundaries, i.e. " << stages << " stages"
                                        << (v > 1 ? " of " + std::to_string(v) + " model chunks (virtual_stages)" : ""));
  std::vector<int> replicas(stages, 1);
  if (!options.replicas.empty()) {
    PARTRAIN_CHECK(static_cast<int>(options.replicas.size()) == stages,
                   "[parallel] replicas: " << options.replicas.size() << " values for " << stages << " stages");
    int total = 0;
    for (int s = 0; s < stages; ++s) {
      PARTRAIN_CHECK(options.replicas[s] >= 1 && options.replicas[s] <= options.world_size,
                     "[parallel] replicas: stage " << s + 1 << " has " << options.replicas[s]
                                                   << " replicas (must be 1.." << options.world_size << ")");
      replicas[s] = static_cast<int>(options.replicas[s]);
      total += replicas[s];
    }
    PARTRAIN_CHECK(options.world_size % total == 0,
                   "[parallel] replicas: " << total << " devices per pipeline replica do not divide the world size "
                                           << options.world_size);
  } else {
    PARTRAIN_CHECK(options.world_size % stages == 0,
                   "[parallel] boundaries: " << stages << " stages of 1 replica do not divide the world size "
                                             << options.world_size << "; set replicas");
  }
  std::vector<int> chunk_replicas;  // every chunk has its pipeline stage's replicas
  for (int c = 0; c < chunks; ++c) chunk_replicas.push_back(replicas[stage_of_chunk(options.schedule, c, stages)]);
  std::vector<std::vector<int>> stage_tasks;
  for (const auto& [first, last] : ranges) stage_tasks.push_back(join_groups(groups, first, last));
  return plan_from_stages(graph, std::move(stage_tasks), chunk_replicas, cost, options, "manual");
}

}  // namespace partrain::partition
