// Interleaved pipelines in RaNNC's search (Narayanan et al., SC'21 §2.2; issue 25); see interleaving.h.
#include "partition/rannc/interleaving.h"
#include "partition/rannc/block_ranges.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/error.h"
#include "partition/common/plan_builder.h"
#include "partition/rannc/stage_dp.h"
#include "profile/memory_model.h"

namespace partrain::partition {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Configurations (by objective) turned into plans and simulated: the objective ranks them
// closely but not exactly as the simulator does (uneven chunks, per-chunk recomputation choices).
constexpr std::size_t kPlansPriced = 4;

// Measured costs of block ranges, cached for one search.
class ChunkCosts {
 public:
  ChunkCosts(const std::vector<std::vector<int>>& blocks, const CostModel& cost)
      : blocks_(blocks), cost_(cost), ranges_(blocks, cost) {
    BlockRanges::check(blocks);
    own_tasks_ = ranges_.own_tasks();
  }

  int block_count() const { return static_cast<int>(blocks_.size()); }
  const CostModel& cost() const { return cost_; }

  std::vector<int> range_tasks(int b, int e) const { return ranges_.range_tasks(b, e); }
  const profile::Measurement& measurement(int b, int e, std::int64_t batch) { return ranges_.measurement(b, e, batch); }

  // The undominated in-flight states of stage s's interleaved compute order (plan/schedule.h),
  // cached: they depend on (S, v, M, s) only, and the search scores many splits of each.
  const std::vector<InFlightState>& in_flight_states(int S, int v, int M, int s) {
    const std::array<int, 4> key = {S, v, M, s};
    auto found = in_flight_states_.find(key);
    if (found == in_flight_states_.end())
      found = in_flight_states_.emplace(key, partrain::in_flight_states(interleaved_compute_order(S, v, M, s), v)).first;
    return found->second;
  }

  // A chunk's time: the stage DP's stage time (stage_dp.cpp StageRun), as predict_plan prices it.
  double seconds(int b, int e, std::int64_t batch, bool across_nodes, bool recompute) {
    const profile::Measurement& m = measurement(b, e, batch);
    const double forward = m.forward_seconds + cost_.transfer_seconds(m.boundary_output_bytes, across_nodes);
    const double backward = m.backward_seconds + cost_.transfer_seconds(m.boundary_input_bytes, across_nodes) +
                            (recompute ? m.forward_seconds : 0.0);
    return forward + backward;
  }

  // The least compute of any chunk holding block b and the sum over blocks (seconds, at `batch`):
  // block b's own tasks alone; {0, 0} when the cost model cannot measure them (e.g. a profile of
  // whole layers), which disables the bound.
  struct OwnCompute {
    double largest = 0;
    double total = 0;
  };
  OwnCompute own_compute(std::int64_t batch, bool recompute, bool sub_pipelined) {
    const std::uint64_t key = (static_cast<std::uint64_t>(batch) << 1) | (recompute ? 1u : 0u);
    auto found = own_compute_.find(key);
    if (found != own_compute_.end()) return found->second;
    OwnCompute result;
    // Merak's sub-pipelined TMP hides up to half of a pass behind its all-reduces (stage_dp.cpp).
    const double scale = sub_pipelined ? 0.5 : 1.0;
    try {
      for (const std::vector<int>& own : own_tasks_) {
        if (own.empty()) continue;
        const profile::Measurement m = cost_.measure(own, batch);
        const double compute = scale * (m.forward_seconds + m.backward_seconds + (recompute ? m.forward_seconds : 0.0));
        result.largest = std::max(result.largest, compute);
        result.total += compute;
      }
    } catch (const Error&) {
      result = OwnCompute{};
    }
    return own_compute_.emplace(key, result).first->second;
  }

 private:
  const std::vector<std::vector<int>>& blocks_;
  const CostModel& cost_;
  std::vector<std::vector<int>> own_tasks_;
  BlockRanges ranges_;  // the blocks' ranges and their measurements
  std::unordered_map<std::uint64_t, OwnCompute> own_compute_;
  std::map<std::array<int, 4>, std::vector<InFlightState>> in_flight_states_;
};

// The min-max chunk DP for one (batch, transfers across nodes, recomputation): value(c, e) is the
// least largest chunk time of blocks 0..e−1 in c chunks, for every c ≤ k at once, so every S·v of a
// search reads the same table. A chunk [b, e) is only tried below walls[b], the first end at which
// its parameters alone cannot fit a device (stage_dp.cpp's parameter wall); k + 1: no wall.
// O(k · Σ_b (walls[b] − b)) steps over the chunk times, each measured once.
class ChunkTable {
 public:
  ChunkTable(ChunkCosts& costs, std::int64_t batch, bool across_nodes, bool recompute, const std::vector<int>& walls)
      : k_(costs.block_count()), value_(static_cast<std::size_t>(k_ + 1) * (k_ + 1), kInfinity),
        from_(static_cast<std::size_t>(k_ + 1) * (k_ + 1), -1) {
    std::vector<std::vector<double>> seconds(k_);  // seconds[b][e − b − 1]: chunk [b, e)
    for (int b = 0; b < k_; ++b)
      for (int e = b + 1; e <= std::min(k_, walls[b] - 1); ++e)
        seconds[b].push_back(costs.seconds(b, e, batch, across_nodes, recompute));
    at(0, 0) = 0;
    for (int c = 1; c <= k_; ++c) {
      for (int b = c - 1; b < k_; ++b) {
        const double before = at(c - 1, b);
        if (!std::isfinite(before)) continue;
        for (std::size_t i = 0; i < seconds[b].size(); ++i) {
          const int e = b + 1 + static_cast<int>(i);
          const double largest = std::max(before, seconds[b][i]);
          if (largest < at(c, e)) {
            at(c, e) = largest;
            from_[index(c, e)] = b;
          }
        }
      }
    }
  }

  // The best split into `chunks` chunks (infeasible: more chunks than blocks, or none fits).
  ChunkSplit split(int chunks) const {
    ChunkSplit result;
    if (chunks < 1 || chunks > k_ || !std::isfinite(value_[index(chunks, k_)])) return result;
    result.feasible = true;
    result.max_chunk_seconds = value_[index(chunks, k_)];
    result.first_block.assign(chunks, 0);
    for (int c = chunks, e = k_; c >= 1; --c) {
      e = from_[index(c, e)];
      result.first_block[c - 1] = e;
    }
    return result;
  }

 private:
  std::size_t index(int c, int e) const { return static_cast<std::size_t>(c) * (k_ + 1) + e; }
  double& at(int c, int e) { return value_[index(c, e)]; }

  int k_;
  std::vector<double> value_;
  std::vector<int> from_;
};

// Per block b, the first end e at which blocks [b, e) cannot fit a device even alone: their
// parameters times the model-state factor with the optimizer state sharded as far as it goes exceed
// the usable memory (k + 1: none). A rank holds at least one such chunk, so no longer chunk is tried
// (the stage DP's parameter wall). A block the cost model cannot measure has no wall.
std::vector<int> parameter_walls(ChunkCosts& costs, const PlannerOptions& options) {
  const int k = costs.block_count();
  profile::MemoryPolicy policy = stage_memory_policy(options, 0, 2, 1);
  if (options.zero == 1) policy.optimizer_shards = std::numeric_limits<int>::max();
  const double factor = profile::model_state_factor(policy);
  const double usable = options.usable_memory_bytes(costs.cost().device());
  std::vector<int> walls(k, k + 1);
  for (int b = 0; b < k; ++b) {
    try {
      for (int e = b + 1; e <= k; ++e) {
        if (costs.measurement(b, e, 1).parameter_bytes * factor > usable) {
          walls[b] = e;
          break;
        }
      }
    } catch (const Error&) {
      walls[b] = k + 1;
    }
  }
  return walls;
}

// One configuration of the interleaved search.
struct Configuration {
  double lower_bound = 0;      // on its objective
  int devices = 0;             // D: devices of one pipeline replica
  int pipeline_replicas = 0;   // R
  int microbatches = 0;        // M, a multiple of S
  int stages = 0;              // S: pipeline ranks, r = D / S replicas each
  int virtual_stages = 0;      // v ≥ 2
  std::int64_t batch = 0;      // per-replica microbatch ⌈microbatch / r⌉
  bool across_nodes = false;   // point-to-point transfers cross nodes
};

// A configuration with its chunks and objective.
struct Scored {
  double objective = kInfinity;
  Configuration configuration;
  std::vector<int> first_block;
};

PlannerOptions chunk_options(const PlannerOptions& options, int v) {
  PlannerOptions fixed = options;
  fixed.schedule = ScheduleKind::Interleaved;
  fixed.virtual_stages = v;
  return fixed;
}

// The objective of a configuration's split and whether every rank's chunks can fit its memory with
// their activations recomputed from the chunk boundaries (the least any recompute policy keeps);
// infinity when they cannot.
double score(ChunkCosts& costs, const PlannerOptions& options, const Configuration& c, const std::vector<int>& first,
             double chunk_seconds) {
  const CostModel& cost = costs.cost();
  const int k = costs.block_count();
  const int S = c.stages, v = c.virtual_stages, chunks = S * v;
  const int replicas = c.devices / S;
  const int group = replicas * c.pipeline_replicas;  // a rank's data-parallel group
  const bool group_across = group > cost.device().devices_per_node;
  const PlannerOptions fixed = chunk_options(options, v);
  const double usable = options.usable_memory_bytes(cost.device());
  double largest_allreduce = 0;
  for (int s = 0; s < S; ++s) {
    // The rank's peak as predict_plan finds it (record_rank_peaks), from its compute order alone.
    double allreduce = 0;
    std::vector<profile::StageMemory> memory;
    for (int chunk = s; chunk < chunks; chunk += S) {
      const profile::Measurement& m = costs.measurement(first[chunk], chunk + 1 < chunks ? first[chunk + 1] : k, c.batch);
      const GradientSynchronisation synchronisation = gradient_synchronisation_seconds(
          cost, m.parameter_bytes, group, group_across, options.zero == 1, options.mixed_precision);
      // (Exposed: less what the bucketed reduction hides under the chunk's last backward.)
      allreduce += synchronisation.exposed_seconds(m.backward_seconds, m.parameter_bytes, options.overlap_bucket_bytes);
      memory.push_back(profile::stage_memory(m, stage_memory_policy(fixed, chunk, chunks, c.microbatches, group)));
    }
    if (rank_peak_bytes(memory, costs.in_flight_states(S, v, c.microbatches, s)) > usable) return kInfinity;
    largest_allreduce = std::max(largest_allreduce, allreduce);
  }
  return (static_cast<double>(c.microbatches) * v + S - 1) * chunk_seconds + largest_allreduce;
}

// The plan of a scored configuration with predict_plan's figures; std::nullopt when a rank's chunks
// do not fit its memory.
std::optional<Plan> assemble(const Graph& graph, ChunkCosts& costs, const PlannerOptions& options, const Scored& scored) {
  const Configuration& c = scored.configuration;
  const int k = costs.block_count(), chunks = c.stages * c.virtual_stages;
  const PlannerOptions fixed = chunk_options(options, c.virtual_stages);
  Plan plan = plan_header(graph, fixed, "rannc");
  plan.virtual_stages = c.virtual_stages;
  plan.pipeline_replicas = c.pipeline_replicas;
  plan.world_size = options.world_size;
  plan.microbatches = c.microbatches;
  std::vector<std::vector<int>> tasks;
  for (int chunk = 0; chunk < chunks; ++chunk)
    tasks.push_back(costs.range_tasks(scored.first_block[chunk], chunk + 1 < chunks ? scored.first_block[chunk + 1] : k));
  append_stages(plan, graph, std::move(tasks), std::vector<int>(chunks, c.devices / c.stages));
  predict_plan(plan, graph, costs.cost(), fixed);
  if (memory_excess_bytes(plan, costs.cost(), fixed) > 0) return std::nullopt;
  plan.validate(graph);
  return plan;
}

}  // namespace

ChunkSplit balance_chunks(const std::vector<std::vector<int>>& blocks, const CostModel& cost, int chunks,
                          std::int64_t batch, bool across_nodes, bool recompute) {
  PARTRAIN_CHECK(chunks >= 1, "rannc: " << chunks << " model chunks");
  PARTRAIN_CHECK(batch >= 1 && batch < (std::int64_t{1} << 32), "rannc: a chunk's batch must be in [1, 2^32), not " << batch);
  ChunkCosts costs(blocks, cost);
  const ChunkTable table(costs, batch, across_nodes, recompute, std::vector<int>(blocks.size(), costs.block_count() + 1));
  return table.split(chunks);
}

double interleaved_objective_seconds(const Plan& plan) {
  double slowest = 0, allreduce = 0;
  for (const PlanStage& stage : plan.stages) slowest = std::max(slowest, stage.forward_seconds + stage.backward_seconds);
  for (int s = 0; s < plan.pipeline_stages(); ++s) {
    double rank = 0;
    for (int chunk : plan.chunks_of_stage(s))
      rank += plan.stages[chunk].allreduce_seconds - plan.stages[chunk].allreduce_hidden_seconds;
    allreduce = std::max(allreduce, rank);
  }
  const double steps = static_cast<double>(plan.microbatches) * plan.virtual_stages + plan.pipeline_stages() - 1;
  return steps * slowest + allreduce;
}

std::optional<Plan> plan_interleaved_rannc(const Graph& graph, const std::vector<std::vector<int>>& blocks,
                                           const CostModel& cost, const PlannerOptions& options,
                                           double objective_bound) {
  PARTRAIN_CHECK(options.schedule == ScheduleKind::Interleaved && options.virtual_stages == 0,
                 "rannc: the interleaved search needs schedule = \"interleaved\" and virtual_stages = \"auto\"");
  ChunkCosts costs(blocks, cost);
  const int k = costs.block_count();
  const int world = options.world_size;
  const int per_node = cost.device().devices_per_node;
  // recompute = "auto": each configuration is split and scored without recomputation first, and
  // with recomputation from the chunk boundaries (the least memory) when that does not fit;
  // assemble's predict_plan then gives each chunk the cheapest policy that fits.
  const bool choosing = options.recompute == "auto";
  PlannerOptions without_recomputation = options;
  without_recomputation.recompute = "none";

  // Every configuration the runtime can run, with a lower bound on its objective: a chunk takes at
  // least its largest block's own compute and the average share Σ / (S·v) of the blocks' own
  // compute (the bound only needs times that add up over tasks, as the stage DP's).
  std::vector<Configuration> configurations;
  for (int devices : stage_dp_pipeline_sizes(world, per_node)) {
    const int pipeline_replicas = world / devices;
    for (int microbatches : stage_dp_microbatch_counts(options, pipeline_replicas)) {
      const std::int64_t parts = static_cast<std::int64_t>(pipeline_replicas) * microbatches;
      if (options.global_batch % parts != 0) continue;
      const std::int64_t microbatch = options.global_batch / parts;
      for (int S = 2; S <= devices && 2 * S <= k; ++S) {
        if (devices % S != 0 || microbatches % S != 0 || (options.stages > 0 && S != options.stages)) continue;
        const int replicas = devices / S;
        if (replicas > microbatch) continue;  // every replica takes a sample of each microbatch
        const std::int64_t batch = (microbatch + replicas - 1) / replicas;
        for (int v = 2; S * v <= k; ++v) {
          // Under "auto" a configuration may run without recomputation: bound it by that.
          const bool recompute = !choosing && recompute_policy(chunk_options(options, v), S * v) != RecomputePolicy::None;
          const ChunkCosts::OwnCompute own = costs.own_compute(batch, recompute, options.sub_pipelined_tmp);
          const double steps = static_cast<double>(microbatches) * v + S - 1;
          // More chunks only raise the bound's largest-block term: stop there.
          if (steps * own.largest * (1 - 1e-12) >= objective_bound) break;
          const double lower = steps * std::max(own.largest, own.total / (S * v)) * (1 - 1e-12);
          if (lower >= objective_bound) continue;
          configurations.push_back(
              Configuration{lower, devices, pipeline_replicas, microbatches, S, v, batch, devices > per_node});
        }
      }
    }
  }
  std::stable_sort(configurations.begin(), configurations.end(),
                   [](const Configuration& x, const Configuration& y) { return x.lower_bound < y.lower_bound; });

  // Best-first: split and score configurations until the next bound cannot enter the best few.
  std::vector<Scored> best;  // ascending objective, at most kPlansPriced
  // One chunk table per (batch, across nodes, recomputation); null: the cost model could not measure a range.
  std::unordered_map<std::uint64_t, std::unique_ptr<ChunkTable>> tables;
  const std::vector<int> walls = parameter_walls(costs, options);
  for (const Configuration& c : configurations) {
    const double threshold = best.size() == kPlansPriced ? best.back().objective : objective_bound;
    if (c.lower_bound >= threshold) break;
    const int chunks = c.stages * c.virtual_stages;
    const auto table_for = [&](bool recompute) -> const ChunkTable* {
      const std::uint64_t key = (static_cast<std::uint64_t>(c.batch) << 2) | (c.across_nodes ? 2u : 0u) | (recompute ? 1u : 0u);
      auto found = tables.find(key);
      if (found == tables.end()) {
        std::unique_ptr<ChunkTable> table;
        try {
          table = std::make_unique<ChunkTable>(costs, c.batch, c.across_nodes, recompute, walls);
        } catch (const Error&) {
          // A range the cost model cannot measure (e.g. a profile of whole layers): no candidates.
        }
        found = tables.emplace(key, std::move(table)).first;
      }
      return found->second.get();
    };
    double objective = kInfinity;
    ChunkSplit split;
    if (choosing) {
      if (const ChunkTable* table = table_for(false)) {
        split = table->split(chunks);
        if (split.feasible) objective = score(costs, without_recomputation, c, split.first_block, split.max_chunk_seconds);
      }
    }
    if (!(objective < kInfinity)) {
      const bool recompute = recompute_policy(chunk_options(options, c.virtual_stages), chunks) != RecomputePolicy::None;
      const ChunkTable* table = table_for(recompute);
      if (!table) continue;
      split = table->split(chunks);
      if (!split.feasible) continue;
      objective = score(costs, options, c, split.first_block, split.max_chunk_seconds);
    }
    if (!(objective < threshold)) continue;
    // Pipeline sizes that give the same ranks (the same S, v, M, per-replica batch and chunks) and
    // the same objective differ only in how the replicas are counted: one of them is enough.
    const auto same = [&](const Scored& other) {
      const Configuration& o = other.configuration;
      return o.stages == c.stages && o.virtual_stages == c.virtual_stages && o.microbatches == c.microbatches &&
             o.batch == c.batch && std::fabs(other.objective - objective) <= 1e-12 * objective;
    };
    if (std::any_of(best.begin(), best.end(), same)) continue;
    Scored scored{objective, c, split.first_block};
    best.insert(std::upper_bound(best.begin(), best.end(), scored,
                                 [](const Scored& x, const Scored& y) { return x.objective < y.objective; }),
                std::move(scored));
    if (best.size() > kPlansPriced) best.pop_back();
  }

  std::optional<Plan> fastest;
  for (const Scored& scored : best) {
    std::optional<Plan> plan = assemble(graph, costs, options, scored);
    if (plan && (!fastest || plan->predicted_step_seconds < fastest->predicted_step_seconds * (1 - 1e-12)))
      fastest = std::move(plan);
  }
  return fastest;
}

}  // namespace partrain::partition
