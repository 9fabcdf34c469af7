// RaNNC stage-level partitioning (Tanaka et al., IPDPS 2021, §III-C, Algorithms 1 and 2); see
// stage_dp.h. Implemented from the paper's description.
//
// Algorithm 1 is computed "from the end of the pipeline": W[j][b][d] is the best placement of blocks
// b..k−1 into the last j stages on d devices. A stage's memory depends on its position only through
// its distance j to the end (1F1B keeps min(S − s, M) = min(j, M) microbatches in flight, GPipe M)
// and on S > 1 (recomputation), so one table serves every S ≥ 2 at once: V_S = W[S][0][D]. The
// recurrence is the paper's V[s][b][d] = min_{b' < b, d' < d} max(V[s−1][b'][d'], t(b'+1..b, d − d'))
// mirrored. S = 1 (one stage, no recomputation under "auto") is evaluated on its own.
//
// The objective. The paper's text (§III-C) minimises the longest stage execution time
// max_i h(b_{i−1}, b_i, sd_i); its Algorithm 1 as printed keeps the largest forward and the largest
// backward apart and minimises their sum (lines 21–26), which is not a min-max problem, so a DP
// over it is a heuristic. Algorithm 2 searches configurations with the text's objective, solved
// exactly here (checked against a brute force) and tied to the (M + S − 1) · stage time closed
// form; for the configuration it chooses, the printed algorithm's split (phase_maxima) is the second
// candidate, and the one whose simulated schedule is faster is kept. Measured on random chains
// against the best split by simulation (test_stage_dp, TheObjectiveReadings...): mean excess step
// time 3.3% with the text's objective alone, 2.3% with the printed one, 1.7% keeping the faster;
// the printed one wins because fill and drain (Σ forward, then Σ backward) dominate short pipelines.
// Other differences from the paper, on purpose:
// - The all-reduce term of the step time is made exact by re-running the DP with the stages'
//   all-reduce capped below the last optimum's (plan_stages_rannc), instead of ignoring it in the DP.
// - Algorithm 2 searches every node count (RaNNC stops at the first that fits).
// Pruning that keeps the optimum: a stage needs ≥ 1 device and ≤ ⌈microbatch⌉ replicas, cells are
// kept only for device counts from which the remaining stages can use exactly D devices, rows start
// at the fewest devices with which the suffix fits memory (RaNNC's dmin), and candidates whose
// (M + j − 1) · stage time already reaches the best step time found are dropped.
// Planning at scale (issue 25: a 1T GPT on 3,072 devices, k in the hundreds once blocks are split
// to fit, D up to 3,072) adds, still exact within the cost model:
// - a lower bound on a configuration's step time (split_lower_bound: the blocks' own compute
//   through the pipeline plus (M − 1) times the largest block or the replica-seconds over D) that
//   skips the table when it reaches the best step so far (or a better layout's, step_seconds_bound);
// - a parameter wall per block (parameter_wall): no range is extended past the first end whose
//   model state cannot fit a device however far ZeRO-1 shards it, so a deep model whose layers fit
//   only a few to a device costs O(k) ranges per block start, not O(k²);
// - stage costs per run of replica counts with the same per-replica batch (O(√microbatch) entries
//   per range instead of D), all-reduces priced when a cell is about to change;
// - two rolling layers of values, back pointers kept for the valid cells only, each layer's work
//   confined to its device window, and the table ending at its first layer without a valid cell.
// These assume what every cost model here satisfies: forward and backward seconds add up over
// tasks (halved under Merak's sub-pipelined TMP, whose overlap can hide up to half), a stage's
// memory is at least its model state, and more tasks read at least as many parameters.
#include "partition/rannc/stage_dp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "partition/common/plan_builder.h"
#include "partition/common/recomputation.h"
#include "partition/rannc/block_ranges.h"
#include "partition/rannc/interleaving.h"
#include "plan/schedule.h"
#include "profile/memory_model.h"

namespace partrain::partition {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr int kMaxAllreduceRounds = 64;
// Stage evaluations (S · k² · D · widest replica count) above which the printed Algorithm 1's
// second candidate is not computed: about a second of table filling.
constexpr double kPhaseMaximaBudget = 2e8;

double gib(double bytes) { return bytes / static_cast<double>(1ull << 30); }

std::string gib_text(double bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f GiB", std::ceil(gib(bytes) * 100.0) / 100.0);
  return text;
}

// What the DP minimises: stage time (planning) or stage memory (finding the memory that would fit).
enum class Objective { Time, Memory };

// A configuration with its derived figures.
struct Setting {
  int devices = 1;
  int pipeline_replicas = 1;
  int microbatches = 1;
  std::int64_t microbatch_size = 1;  // samples of one microbatch of one copy
  bool across_nodes = false;         // stage-to-stage transfers cross nodes (as predict_plan)
};

// One cell of the DP table: the best placement of a block suffix into j stages on d devices.
struct Cell {
  double value = kInfinity;      // the objective: largest stage time (or memory)
  double allreduce = kInfinity;  // the largest stage all-reduce of that placement
  int next_block = -1;           // the first stage holds blocks [b, next_block)
  int replicas = 0;              // ... on this many devices
};

// A recompute policy a stage may run under recompute = "auto" (choose_stage_recomputation's
// candidates), with the stage time it gives.
struct RecomputeVariant {
  RecomputePolicy policy = RecomputePolicy::None;
  double seconds = 0;                // forward + backward, the repeated forward included (NaN: not yet known)
  StageRecomputation recomputation;  // what it keeps (its memory) and, once known, repeats
  const SegmentedRecomputation* structure = nullptr;  // selective: its segments (for the seconds)
};

// Stage candidates: blocks [b, e) on r ∈ [first, last] replicas (per pipeline replica), the replica
// counts with the same per-replica batch ⌈microbatch / r⌉ and so the same times and memory (only
// the all-reduce over r × pipeline replicas ranks differs: allreduce_at).
struct StageRun {
  int first = 1, last = 1;
  double forward = 0;   // forward + sending the outputs
  double backward = 0;  // backward + sending the input gradients (+ the forward again when recomputing)
  double seconds = 0;   // forward + backward
  const profile::Measurement* measurement = nullptr;
  /// recompute = "auto" with the graph known (StageDp::choosing): none, selective, per-layer and
  /// boundary recomputation, least repeated work first (the plan builder's order); the DP gives a
  /// stage the first that fits, as predict_plan will. Only "none" until a replica count needs
  /// another (StageDp::all_variants): most stages fit without recomputation.
  ///
  /// The order is fixed: with forward seconds adding up over tasks (as the DP assumes throughout),
  /// selective repeats the attention cores, per-layer every task of the stage (its segments are the
  /// stage's layers, together all its tasks) and boundaries every task too, so their repeated
  /// seconds ascend and choose_stage_recomputation's stable sort keeps this order.
  mutable std::vector<RecomputeVariant> variants;
  int begin_block = 0, end_block = 0;  // the blocks [begin, end) and per-replica batch measured
  std::int64_t batch = 0;
  /// StageDp::allreduce_at(*measurement, r) by r − first, NaN until asked (the DP asks for the same
  /// r from many device counts); empty until the first is asked.
  mutable std::vector<double> allreduce;
};

// Where the DP came from, per cell of a layer j: the first stage holds blocks [b, next_block) on
// `replicas` devices. A layer keeps, per block b, only the device counts [first_devices, ...] of
// its valid cells.
struct BackPointer {
  int next_block = -1;
  int replicas = 0;
};
struct BackRow {
  int first_devices = 0;
  std::vector<BackPointer> cells;  // index d − first_devices
};

class StageDp {
 public:
  // `graph` (may be null: recompute = "auto" then prices every stage of S ≥ 2 with recomputation at
  // its boundaries, the least memory) lets "auto" price each stage under the policy it will run.
  StageDp(const std::vector<std::vector<int>>& blocks, const CostModel& cost, const PlannerOptions& options,
          const Graph* graph = nullptr)
      : blocks_(blocks), cost_(cost), options_(options), usable_(options.usable_memory_bytes(cost.device())),
        zero_(options.zero == 1), ranges_(blocks, cost), graph_(graph),
        choosing_(graph != nullptr && options.recompute == "auto" && !schedule_has_chunks(options.schedule)) {
    BlockRanges::check(blocks);
    PARTRAIN_CHECK(options.global_batch > 0 && options.global_batch < (std::int64_t{1} << 32),
                   "rannc: the global batch must be in [1, 2^32), not " << options.global_batch);
    PARTRAIN_CHECK(options.world_size > 0, "rannc: the world size must be positive, not " << options.world_size);
    PARTRAIN_CHECK(options.memory_margin >= 0 && options.memory_margin < 1,
                   "rannc: memory_margin must be in [0, 1), not " << options.memory_margin);
    own_tasks_ = ranges_.own_tasks();
  }

  int block_count() const { return static_cast<int>(blocks_.size()); }
  double usable_memory() const { return usable_; }
  // Whether each stage is priced under the recompute policy it would run (recompute = "auto").
  bool choosing() const { return choosing_; }

  // The setting of a configuration, or false when the batch does not split into it.
  bool make_setting(int devices, int pipeline_replicas, int microbatches, Setting& setting) const {
    if (devices <= 0 || pipeline_replicas <= 0 || microbatches <= 0) return false;
    const std::int64_t parts = static_cast<std::int64_t>(pipeline_replicas) * microbatches;
    if (options_.global_batch % parts != 0) return false;
    setting.devices = devices;
    setting.pipeline_replicas = pipeline_replicas;
    setting.microbatches = microbatches;
    setting.microbatch_size = options_.global_batch / parts;
    setting.across_nodes = devices > cost_.device().devices_per_node;
    return true;
  }

  std::vector<int> range_tasks(int b, int e) const { return ranges_.range_tasks(b, e); }
  const profile::Measurement& measurement(int b, int e, std::int64_t batch) { return ranges_.measurement(b, e, batch); }

  // Measurement of block b's own tasks (non-empty) at `batch` samples, cached for the whole search.
  const profile::Measurement& own_measurement(int b, std::int64_t batch) {
    const std::uint64_t key = (static_cast<std::uint64_t>(b) << 32) | static_cast<std::uint64_t>(batch);
    auto found = own_measurements_.find(key);
    if (found != own_measurements_.end()) return found->second;
    return own_measurements_.emplace(key, cost_.measure(own_tasks_[b], batch)).first->second;
  }

  // Costs of blocks [b, e) on r = 1..min(D, microbatch) replicas under the current setting, one entry
  // per run of replica counts with the same per-replica batch (O(√microbatch) entries, not D),
  // cached per setting.
  const std::vector<StageRun>& stage_runs(int b, int e, bool recompute) {
    std::vector<StageRun>& runs = stage_runs_[(recompute ? 1 : 0)][b * (block_count() + 1) + e];
    if (!runs.empty()) return runs;
    const std::int64_t batch = setting_.microbatch_size;
    const std::int64_t most = std::min<std::int64_t>(setting_.devices, batch);
    for (std::int64_t r = 1; r <= most;) {
      const std::int64_t per_replica = (batch + r - 1) / r;
      // The last r with ⌈batch / r⌉ = per_replica.
      const std::int64_t last = per_replica == 1 ? most : std::min(most, (batch - 1) / (per_replica - 1));
      const profile::Measurement& m = measurement(b, e, per_replica);
      StageRun run;
      run.first = static_cast<int>(r);
      run.last = static_cast<int>(last);
      run.measurement = &m;
      // The same arithmetic, in the same order, as predict_plan.
      run.forward = m.forward_seconds + cost_.transfer_seconds(m.boundary_output_bytes, setting_.across_nodes);
      run.backward = m.backward_seconds + cost_.transfer_seconds(m.boundary_input_bytes, setting_.across_nodes) +
                     (recompute ? m.forward_seconds : 0.0);
      run.seconds = run.forward + run.backward;
      if (choosing_) {
        run.begin_block = b;
        run.end_block = e;
        run.batch = per_replica;
        run.variants = {RecomputeVariant{RecomputePolicy::None,
                                         run.forward + run.backward - (recompute ? m.forward_seconds : 0.0), {}, nullptr}};
      }
      runs.push_back(run);
      r = last + 1;
    }
    return runs;
  }

  // The run's recompute variants, every one (the run holds only "none", with no repeated work and so
  // first in any case, until asked), their memory figures from the segments (linear in the batch);
  // selective's seconds are left to variant_seconds, as most variants never fit.
  const std::vector<RecomputeVariant>& all_variants(const StageRun& run) {
    if (run.variants.size() > 1) return run.variants;
    const double plain = run.variants[0].seconds;
    const profile::Measurement& whole = *run.measurement;
    for (RecomputePolicy policy : {RecomputePolicy::Selective, RecomputePolicy::Layers}) {
      const SegmentedRecomputation& structure = segments(run.begin_block, run.end_block, policy);
      RecomputeVariant variant{policy, std::numeric_limits<double>::quiet_NaN(),
                               segmented_recomputation_memory(structure, run.batch), &structure};
      if (!structure.repeats_work) {
        variant.seconds = plain;
      } else if (policy == RecomputePolicy::Layers) {  // its segments are every task of the stage
        variant.recomputation.recompute_seconds = whole.forward_seconds;
        variant.seconds = plain + whole.forward_seconds;
      }
      run.variants.push_back(variant);
    }
    RecomputeVariant boundaries{RecomputePolicy::StageBoundaries, plain + whole.forward_seconds, {}, nullptr};
    boundaries.recomputation.before_backward = true;
    boundaries.recomputation.recompute_seconds = whole.forward_seconds;
    run.variants.push_back(boundaries);
    return run.variants;
  }

  // The seconds of variant i of the run (all_variants), measuring selective's repeated attention
  // cores once per range and batch.
  double variant_seconds(const StageRun& run, std::size_t i) {
    RecomputeVariant& variant = run.variants[i];
    if (!std::isnan(variant.seconds)) return variant.seconds;
    const std::uint64_t range = static_cast<std::uint64_t>(run.begin_block) * (block_count() + 1) + run.end_block;
    const std::uint64_t key = (range << 32) | static_cast<std::uint64_t>(run.batch);
    auto found = selective_seconds_.find(key);
    if (found == selective_seconds_.end())
      found = selective_seconds_.emplace(key, cost_.measure(variant.structure->recomputed, run.batch).forward_seconds).first;
    variant.recomputation.recompute_seconds = found->second;
    variant.seconds = run.variants[0].seconds + found->second;
    return variant.seconds;
  }

  // The segments of blocks [b, e) under `policy` (selective or per-layer), from the shared cache
  // once per search.
  const SegmentedRecomputation& segments(int b, int e, RecomputePolicy policy) {
    const std::size_t index = (static_cast<std::size_t>(b) * (block_count() + 1) + e) * 2 + (policy == RecomputePolicy::Layers ? 1 : 0);
    if (segments_.empty()) segments_.assign(static_cast<std::size_t>(block_count() + 1) * (block_count() + 1) * 2, nullptr);
    if (!segments_[index]) {
      SegmentedRecomputationCache& cache = options_.recomputation_cache ? *options_.recomputation_cache : own_cache_;
      segments_[index] = &cache.get(*graph_, range_tasks(b, e), policy, options_.mixed_precision);
    }
    return *segments_[index];
  }

  // The memory policy of a stage `distance` stages from the last of `stages` running `variant`:
  // `base` (stage_memory_policy's) with the variant's kept activations and, outside chunked
  // schedules, its microbatches in flight (recomputation_memory_policy's arithmetic).
  profile::MemoryPolicy variant_policy(const profile::MemoryPolicy& base, int distance, int stages,
                                       const RecomputeVariant& variant) const {
    profile::MemoryPolicy policy = base;
    policy.microbatches_in_flight = microbatches_in_flight(options_.schedule, stages - distance, stages,
                                                           setting_.microbatches, variant.recomputation.before_backward);
    variant.recomputation.apply_to(policy);
    return policy;
  }

  // The fewest replicas in [low, high] with which a stage of unsharded memory `memory` under
  // `policy` fits the usable memory (ZeRO-1 shards its optimizer state over replicas × pipeline
  // replicas ranks, so more replicas need less), or high + 1 when none does.
  int first_fitting_replicas(const profile::Measurement& m, double memory, const profile::MemoryPolicy& policy,
                             int low, int high) const {
    if (!zero_) return memory <= usable_ ? low : high + 1;
    const auto memory_at = [&](int replicas) {
      return profile::zero_stage_memory_bytes(memory, m.parameter_bytes, policy,
                                              static_cast<double>(replicas) * setting_.pipeline_replicas);
    };
    if (memory_at(low) <= usable_) return low;
    const double sharded = m.parameter_bytes * profile::sharded_state_factor(policy);
    const double fixed = memory - m.parameter_bytes * profile::zero_removed_state_factor(policy);
    const double room = usable_ - fixed;  // for sharded / (r · pipeline_replicas)
    if (!(room > 0)) return high + 1;
    const double needed = std::ceil(sharded / (room * setting_.pipeline_replicas));
    if (needed > high) return high + 1;
    int r = std::max(low, static_cast<int>(needed));
    while (r <= high && memory_at(r) > usable_) ++r;  // rounding
    return r;
  }

  // The run holding r replicas, or null when r exceeds the microbatch or the devices.
  static const StageRun* run_for(const std::vector<StageRun>& runs, int r) {
    if (r < 1 || r > runs.back().last) return nullptr;
    auto after = std::upper_bound(runs.begin(), runs.end(), r, [](int x, const StageRun& run) { return x < run.first; });
    return &*std::prev(after);
  }

  // allreduce_at for the run's stage on r ∈ [run.first, run.last] replicas, computed once.
  double run_allreduce(const StageRun& run, int r) const {
    // (Allocated when first asked: most runs are pruned by the bound or memory before.)
    if (run.allreduce.empty())
      run.allreduce.assign(static_cast<std::size_t>(run.last - run.first + 1), std::numeric_limits<double>::quiet_NaN());
    double& cached = run.allreduce[static_cast<std::size_t>(r - run.first)];
    if (std::isnan(cached)) cached = allreduce_at(*run.measurement, r);
    return cached;
  }

  // The gradient all-reduce of a stage measured by `m` on r replicas per pipeline replica (as
  // predict_plan), less what the bucketed all-reduce hides under the stage's last backward
  // (options.overlap_bucket_bytes; the schedule simulator's exposed all-reduce). The backward is
  // taken without recomputation: a recomputing stage hides at least as much.
  double allreduce_at(const profile::Measurement& m, int r) const {
    const int group = r * setting_.pipeline_replicas;
    const GradientSynchronisation synchronisation = gradient_synchronisation_seconds(
        cost_, m.parameter_bytes, group, group > cost_.device().devices_per_node, zero_, options_.mixed_precision);
    return synchronisation.exposed_seconds(m.backward_seconds, m.parameter_bytes, options_.overlap_bucket_bytes);
  }

  // The first block end e > b at which blocks [b, e) cannot fit a device whatever their replicas,
  // batch, recomputation and position (k + 1: none): their parameters times the model-state factor
  // with the optimizer state sharded as far as it goes already exceed the usable memory (a stage's
  // memory is at least its model state: stage_memory_bytes). A stage holding more blocks reads at
  // least the parameters of fewer (the cost models count the distinct parameters its tasks read), so
  // every later end fails too and the DP stops there instead of measuring the O(k²) ranges of a
  // deep model whose layers only fit a few to a device (issue 25). Computed once per block.
  int parameter_wall(int b) {
    if (parameter_walls_.empty()) parameter_walls_.assign(block_count(), -1);
    int& wall = parameter_walls_[b];
    if (wall >= 0) return wall;
    profile::MemoryPolicy policy = stage_memory_policy(options_, 0, 2, 1);
    if (zero_) policy.optimizer_shards = std::numeric_limits<int>::max();  // (without ZeRO nothing is sharded)
    const double factor = profile::model_state_factor(policy);
    wall = block_count() + 1;
    // Parameters do not depend on the batch: the current microbatch's measurements (those of one
    // replica) are the ones the DP reads anyway.
    try {
      for (int e = b + 1; e <= block_count(); ++e) {
        if (measurement(b, e, setting_.microbatch_size).parameter_bytes * factor > usable_) {
          wall = e;
          break;
        }
      }
    } catch (const Error&) {
      // The DP reports the ranges it cannot measure itself; no wall is known here.
    }
    return wall;
  }

  // A lower bound (seconds) on the step objective (M + S − 1) · largest stage time + largest
  // all-reduce of every split into S ≥ 2 stages under `setting` (0 when the cost model cannot
  // measure a block's own tasks). With c_i the least compute of block i's own tasks over the
  // per-replica batches ⌈microbatch / r⌉ (r ≤ widest), w_i the least r · compute at those r, and a
  // stage computing at least as long as its blocks' own tasks would alone (forward + backward
  // seconds add up over tasks in the analytic and calibrated cost models; with Merak's
  // sub-pipelined TMP a pass takes at least max(compute, all-reduce), half of its parts' passes, so
  // the compute is halved): every stage time is at least T = max(max_i c_i, Σ_i w_i / D) (the
  // largest block; D devices share the replica-seconds), the S stage times add up to at least
  // C = Σ_i c_i, and (M + S − 1) · T_max ≥ (M − 1) · T + C and ≥ (M + 1) · T. Algorithm 2 skips the
  // table of a setting whose bound already reaches the best step time found (issue 25).
  double split_lower_bound(const Setting& setting, bool recompute) {
    if (!lower_bound_usable_) return 0;
    const std::int64_t batch = setting.microbatch_size;
    const std::int64_t widest = std::min<std::int64_t>(setting.devices, batch);
    const double scale = options_.sub_pipelined_tmp ? 0.5 : 1.0;
    double largest = 0, total = 0, work = 0;
    try {
      for (int b = 0; b < block_count(); ++b) {
        if (own_tasks_[b].empty()) continue;
        double least = kInfinity, least_work = kInfinity;
        // One r per run of replica counts with the same per-replica batch n: the smallest, r = ⌈batch / n⌉.
        for (std::int64_t r = 1; r <= widest;) {
          const std::int64_t n = (batch + r - 1) / r;
          const profile::Measurement& m = own_measurement(b, n);
          const double compute = scale * (m.forward_seconds + m.backward_seconds + (recompute ? m.forward_seconds : 0.0));
          least = std::min(least, compute);
          least_work = std::min(least_work, static_cast<double>(r) * compute);
          if (n == 1) break;
          r = (batch - 1) / (n - 1) + 1;  // the first r with ⌈batch / r⌉ < n
        }
        largest = std::max(largest, least);
        total += least;
        work += least_work;
      }
    } catch (const Error&) {
      lower_bound_usable_ = false;  // e.g. a profile holding only whole layers
      return 0;
    }
    const double stage = std::max(largest, work / setting.devices);
    const double M = setting.microbatches;
    // Guard against the last bit of rounding between these sums and the DP's.
    return std::max((M - 1) * stage + total, (M + 1) * stage) * (1 - 1e-12);
  }

  // Per-S results of one run of the table.
  struct Result {
    std::vector<Cell> best;  // index S (1..max_stages): the placement of all blocks in S stages on D devices
  };

  // Runs Algorithm 1 for every S in 1..max_stages under `setting`: stages whose all-reduce is not
  // below `allreduce_cap` are not allowed; in Time mode, candidates that cannot reach a step time
  // below `bound` are pruned and stages must fit the usable memory.
  Result run(const Setting& setting, int max_stages, Objective objective, double allreduce_cap, double bound) {
    use_setting(setting);
    const int k = block_count();
    const int D = setting.devices;
    const int M = setting.microbatches;
    const int J = std::min({max_stages, k, D});
    Result result;
    result.best.assign(max_stages + 1, Cell{});
    if (J < 1) return result;

    // ---- S = 1: all blocks on D replicas.
    {
      const RecomputePolicy recompute = recompute_policy(options_, 1);
      const profile::MemoryPolicy policy = stage_memory_policy(options_, 0, 1, M, D * setting.pipeline_replicas);
      const StageRun* c = run_for(stage_runs(0, k, recompute != RecomputePolicy::None), D);
      const double allreduce = c ? allreduce_at(*c->measurement, D) : kInfinity;
      if (c && allreduce < allreduce_cap && choosing_ && objective == Objective::Time) {
        for (std::size_t i = 0;; ++i) {  // the first that fits, as predict_plan
          if (i == 1) all_variants(*c);
          if (i >= c->variants.size()) break;
          const RecomputeVariant& variant = c->variants[i];
          const double memory = profile::stage_memory_bytes(*c->measurement, variant_policy(policy, 1, 1, variant));
          if (memory > usable_) continue;
          const double seconds = variant_seconds(*c, i);
          if (M * seconds < bound) result.best[1] = Cell{seconds, allreduce, k, D};
          break;
        }
      } else if (c && allreduce < allreduce_cap) {
        const double memory = profile::stage_memory_bytes(*c->measurement, policy);
        const double value = objective == Objective::Time ? c->seconds : memory;
        const bool fits = objective == Objective::Memory || memory <= usable_;
        if (fits && (objective == Objective::Memory || M * value < bound))
          result.best[1] = Cell{value, allreduce, k, D};
      }
    }
    if (J < 2) return result;

    // ---- S ≥ 2: the table from the end of the pipeline.
    const int reference = std::max(J, 2);
    const bool recompute = recompute_policy(options_, reference) != RecomputePolicy::None;
    // (Choosing, the cheapest policy repeats no forward: the bound must hold for it.)
    const bool choose = choosing_ && objective == Objective::Time;
    if (objective == Objective::Time && std::isfinite(bound) && split_lower_bound(setting, recompute && !choose) >= bound)
      return result;  // no split into S ≥ 2 stages can beat the bound
    std::vector<profile::MemoryPolicy> policy(J + 1);
    for (int j = 1; j <= J; ++j) {
      policy[j] = stage_memory_policy(options_, reference - j, reference, M);
      // The one-table-for-all-S scheme needs a stage's policy to depend on S − s (and S > 1) only.
      const int smallest = std::max(j, 2);
      const profile::MemoryPolicy other = stage_memory_policy(options_, smallest - j, smallest, M);
      PARTRAIN_CHECK(other.microbatches_in_flight == policy[j].microbatches_in_flight &&
                         other.recompute == policy[j].recompute &&
                         other.optimizer_state_copies == policy[j].optimizer_state_copies &&
                         other.mixed_precision == policy[j].mixed_precision &&
                         other.communication_buffer_bytes == policy[j].communication_buffer_bytes,
                     "rannc: the stage memory policy depends on more than the distance to the last stage");
    }
    const std::size_t row = static_cast<std::size_t>(D) + 1;
    const std::size_t layer = static_cast<std::size_t>(k + 1) * row;
    // Two layers of values (j − 1 and j); each layer's back pointers are kept for its valid cells
    // only (BackRow), which is all backtrack reads. A layer without a valid cell ends the table:
    // every later layer builds on it.
    // (Scratch kept by the object: run is called for every setting of a search, and fresh tables of
    // megabytes each time cost more in allocation and page faults than in filling.)
    std::vector<Cell>& previous_layer = scratch_.previous_layer;
    std::vector<Cell>& current_layer = scratch_.current_layer;
    previous_layer.assign(layer, Cell{});
    current_layer.assign(layer, Cell{});
    back_.resize(std::max(back_.size(), static_cast<std::size_t>(J + 1)));
    for (std::size_t j = 0; j < back_.size(); ++j)
      for (BackRow& back : back_[j]) back.cells.clear();
    const auto cell = [&](int j, int b, int d) -> Cell& {
      return ((j & 1) ? current_layer : previous_layer)[b * row + d];
    };
    // dmin[j][b]: fewest devices with which blocks b.. fit in j stages (D + 1: none).
    std::vector<int>& dmin = scratch_.dmin;
    dmin.assign(static_cast<std::size_t>(J + 1) * (k + 1), D + 1);
    // dmax[j][b]: most devices with which they fit (0: none).
    std::vector<int>& dmax = scratch_.dmax;
    dmax.assign(static_cast<std::size_t>(J + 1) * (k + 1), 0);
    // Only device counts from which some S ≤ J can still use exactly D devices with at most
    // `widest` replicas per stage are worth a cell: d ∈ [D − (J − j) · widest, j · widest].
    const int widest = static_cast<int>(std::min<std::int64_t>(D, setting.microbatch_size));
    const auto d_low = [&](int j) { return std::max<long>(j, static_cast<long>(D) - static_cast<long>(J - j) * widest); };
    const auto d_high = [&](int j) { return std::min<long>(D, static_cast<long>(j) * widest); };

    // Range minimum (by value, then all-reduce) over W[j−1][e][lo..hi]: a sparse table per block e,
    // rebuilt for each layer. Replica counts r with the same per-replica batch ⌈microbatch / r⌉
    // give the same stage time and memory, so one window query per (run of such r, d) replaces
    // the loop over every r: O(J k² · #batches · D) instead of O(J k² D²).
    int levels = 1;
    while ((1 << levels) <= D + 1) ++levels;
    std::vector<int>& sparse = scratch_.sparse;
    sparse.assign(static_cast<std::size_t>(k + 1) * levels * row, 0);
    const auto sparse_at = [&](int e, int level) { return sparse.data() + (static_cast<std::size_t>(e) * levels + level) * row; };
    const auto less = [](const Cell& x, const Cell& y) {
      return x.value < y.value || (x.value == y.value && x.allreduce < y.allreduce);
    };

    for (int j = 1; j <= J; ++j) {
      const double factor = M + j - 1;  // the step multiplies this stage's time by at least M + j − 1
      // Layer j writes and reads only the rows b ≤ k − j within its device window [low, high].
      const int low = static_cast<int>(d_low(j)), high = static_cast<int>(d_high(j));
      for (int b = 0; b <= k - j && low <= high; ++b) std::fill(&cell(j, b, low), &cell(j, b, high) + 1, Cell{});
      if (j >= 2) {
        for (int e = 1; e <= k; ++e) {
          // Only over the valid cells [dmin, dmax] of W[j − 1][e]: the window queries stay inside.
          const int lo = dmin[(j - 1) * (k + 1) + e], hi = dmax[(j - 1) * (k + 1) + e];
          if (lo > hi) continue;
          int* base = sparse_at(e, 0);
          for (int d = lo; d <= hi; ++d) base[d] = d;
          for (int level = 1; level < levels && (1 << level) <= hi - lo + 1; ++level) {
            const int* lower = sparse_at(e, level - 1);
            int* upper = sparse_at(e, level);
            const int half = 1 << (level - 1);
            for (int d = lo; d + (1 << level) <= hi + 1; ++d) {
              const int x = lower[d], y = lower[d + half];
              upper[d] = less(cell(j - 1, e, y), cell(j - 1, e, x)) ? y : x;
            }
          }
        }
      }
      const auto window_min = [&](int e, int lo, int hi) {
        int level = 0;
        while ((2 << level) <= hi - lo + 1) ++level;
        const int* at = sparse_at(e, level);
        const int x = at[lo], y = at[hi - (1 << level) + 1];
        return less(cell(j - 1, e, y), cell(j - 1, e, x)) ? y : x;
      };
      for (int b = 0; b <= k - j; ++b) {
        const int e_first = j == 1 ? k : b + 1;
        int e_last = j == 1 ? k : k - j + 1;
        if (objective == Objective::Time) e_last = std::min(e_last, parameter_wall(b) - 1);
        for (int e = e_first; e <= e_last; ++e) {
          const std::vector<StageRun>& runs = stage_runs(b, e, recompute);
          // A stage's compute (forward + backward, transfers and repeated forwards aside) adds up
          // over its tasks, so it grows with e at any batch: once even the run of the most replicas
          // (the smallest per-replica batch) reaches the bound, no longer stage from b can beat it.
          if (objective == Objective::Time && !runs.empty() &&
              factor * (runs.back().measurement->forward_seconds + runs.back().measurement->backward_seconds) >= bound)
            break;
          const int rest_min = j == 1 ? 0 : dmin[(j - 1) * (k + 1) + e];
          const int rest_max = j == 1 ? 0 : dmax[(j - 1) * (k + 1) + e];
          if (rest_min > D) continue;
          if (low > high) continue;
          const int r_most = std::min(D - rest_min, widest);
          // All-reduce times are finite: without a cap no replica count is excluded by it.
          const bool capped = allreduce_cap < kInfinity;
          for (const StageRun& c : runs) {
           if (c.first > r_most) break;
           const int run_last = std::min(c.last, r_most);
           for (int r = c.first; r <= run_last;) {
            if (capped && !(run_allreduce(c, r) < allreduce_cap)) {
              ++r;
              continue;
            }
            // The run [r, r_end] of replica counts with the same measurement, allowed by the cap.
            // With ZeRO-1 the memory falls with r (the optimizer state is sharded over r × pipeline replicas
            // ranks): a Memory run takes one r at a time, a Time run starts at the first r that fits.
            int r_end = r;
            if (!(zero_ && objective == Objective::Memory)) {
              while (r_end < run_last && (!capped || run_allreduce(c, r_end + 1) < allreduce_cap)) ++r_end;
            }
            const int r_start = r;
            r = r_end + 1;
            // Blocks [b, e) as the first of j stages on r_first..r_last replicas, at stage time `value`.
            const auto place = [&](int r_first, int r_last, double value) {
              if (objective == Objective::Time && factor * value >= bound) return;
              if (j == 1) {
                for (int rr = std::max(r_first, low); rr <= std::min(r_last, high); ++rr) {
                  Cell& target = cell(1, b, rr);
                  if (value > target.value) continue;
                  const double a = run_allreduce(c, rr);
                  if (better(value, a, target)) target = Cell{value, a, e, rr};
                }
                return;
              }
              const int d_last = std::min(high, rest_max + r_last);
              for (int d = std::max(low, rest_min + r_first); d <= d_last; ++d) {
                const int rest = window_min(e, std::max(rest_min, d - r_last), std::min(rest_max, d - r_first));
                const Cell& previous = cell(j - 1, e, rest);
                if (previous.next_block < 0) continue;
                const double v = std::max(value, previous.value);
                if (objective == Objective::Time && factor * v >= bound) continue;
                Cell& target = cell(j, b, d);
                if (v > target.value) continue;  // (the all-reduce only breaks ties)
                const int replicas = d - rest;
                const double a = std::max(run_allreduce(c, replicas), previous.allreduce);
                if (better(v, a, target)) target = Cell{v, a, e, replicas};
              }
            };
            if (choose) {
              // Each replica count gets the cheapest policy that fits there: with ZeRO-1 more
              // replicas need less memory, so a cheaper policy takes the top of the run.
              int upper = r_end;
              for (std::size_t i = 0; upper >= r_start; ++i) {
                if (i == 1) all_variants(c);  // "none" did not cover the run
                if (i >= c.variants.size()) break;
                const RecomputeVariant& variant = c.variants[i];
                // (Seconds ascend: one known to reach the bound ends the search before any memory.)
                if (!std::isnan(variant.seconds) && factor * variant.seconds >= bound) break;
                const profile::MemoryPolicy variant_memory = variant_policy(policy[j], j, reference, variant);
                const double memory = profile::stage_memory_bytes(*c.measurement, variant_memory);
                const int fit = first_fitting_replicas(*c.measurement, memory, variant_memory, r_start, upper);
                if (fit > upper) continue;
                const double seconds = variant_seconds(c, i);
                if (factor * seconds >= bound) break;  // later ones cost more
                place(fit, upper, seconds);
                upper = fit - 1;
              }
              continue;
            }
            double memory = profile::stage_memory_bytes(*c.measurement, policy[j]);  // unsharded
            int r_first = r_start;
            if (zero_) {
              if (objective == Objective::Time) {
                r_first = first_fitting_replicas(*c.measurement, memory, policy[j], r_start, r_end);
                if (r_first > r_end) continue;
              }
              memory = profile::zero_stage_memory_bytes(memory, c.measurement->parameter_bytes, policy[j],
                                                        static_cast<double>(r_first) * setting.pipeline_replicas);
            }
            if (objective == Objective::Time && memory > usable_) continue;
            place(r_first, r_end, objective == Objective::Time ? c.seconds : memory);
           }
          }
        }
        int& least = dmin[j * (k + 1) + b];
        int& most = dmax[j * (k + 1) + b];
        for (int d = std::max(low, 1); d <= high; ++d)
          if (cell(j, b, d).next_block >= 0) {
            least = std::min(least, d);
            most = d;
          }
      }
      // Keep the back pointers of this layer's valid cells.
      bool any = false;
      back_[j].resize(k + 1);
      for (int b = 0; b <= k - j; ++b) {
        const int least = dmin[j * (k + 1) + b], most = dmax[j * (k + 1) + b];
        if (least > most) continue;
        any = true;
        BackRow& back = back_[j][b];
        back.first_devices = least;
        back.cells.resize(static_cast<std::size_t>(most - least + 1));
        for (int d = least; d <= most; ++d) back.cells[d - least] = BackPointer{cell(j, b, d).next_block, cell(j, b, d).replicas};
      }
      if (j >= 2 && low <= D && D <= high) result.best[j] = cell(j, 0, D);
      if (!any) break;
    }
    return result;
  }

  // RaNNC's Algorithm 1 as printed (§III-C, lines 8–36) for S ≥ 2 stages under `setting`: V[s][b][d]
  // places the first b blocks into s stages on d devices, and a placement is scored by its largest
  // stage forward plus its largest stage backward, kept apart (lines 21–26), ties going to the
  // smaller all-reduce. That sum is not a min-max objective, so this DP is a heuristic for it (each
  // cell keeps one placement); it is run for the configuration Algorithm 2 chose, as a second
  // candidate (search_stages). Not the paper's: the dmin rule (lines 30–33) is left out, since it
  // assumes fewer devices never fit where more do not; a stage's batch is ⌈microbatch / replicas⌉
  // and its memory the stage memory policy's, as in run(). Returns feasible = false when nothing fits
  // or when the table would take more than `budget` stage evaluations.
  StageSplit phase_maxima(const Setting& setting, int S, double budget) {
    use_setting(setting);
    StageSplit split;
    const int k = block_count(), D = setting.devices, M = setting.microbatches;
    const int widest = static_cast<int>(std::min<std::int64_t>(D, setting.microbatch_size));
    if (S < 2 || S > std::min(k, D)) return split;
    if (static_cast<double>(S) * k * k * D * widest > budget) return split;
    const bool recompute = recompute_policy(options_, S) != RecomputePolicy::None;
    struct State {
      double forward = kInfinity, backward = kInfinity, allreduce = kInfinity;
      int from_block = -1, from_devices = -1;
    };
    const std::size_t row = static_cast<std::size_t>(D) + 1, layer = static_cast<std::size_t>(k + 1) * row;
    std::vector<State> table(static_cast<std::size_t>(S + 1) * layer);
    const auto at = [&](int s, int b, int d) -> State& { return table[s * layer + b * row + d]; };
    at(0, 0, 0) = State{0, 0, 0, -1, -1};
    for (int s = 1; s <= S; ++s) {
      const profile::MemoryPolicy policy = stage_memory_policy(options_, s - 1, S, M);
      for (int b = s; b <= k - (S - s); ++b) {
        for (int d = s; d <= D - (S - s); ++d) {
          State& target = at(s, b, d);
          for (int previous_block = s - 1; previous_block < b; ++previous_block) {
            const std::vector<StageRun>& runs = stage_runs(previous_block, b, recompute);
            for (int previous_devices = std::max(s - 1, d - widest); previous_devices < d; ++previous_devices) {
              const State& previous = at(s - 1, previous_block, previous_devices);
              if (std::isinf(previous.forward)) continue;
              const int replicas = d - previous_devices;
              const StageRun* run = run_for(runs, replicas);
              if (!run) continue;
              const StageRun& c = *run;
              double memory = profile::stage_memory_bytes(*c.measurement, policy);
              if (zero_)
                memory = profile::zero_stage_memory_bytes(memory, c.measurement->parameter_bytes, policy,
                                                          static_cast<double>(replicas) * setting.pipeline_replicas);
              if (memory > usable_) continue;  // line 18: does not fit the device memory
              const double forward = std::max(previous.forward, c.forward);
              const double backward = std::max(previous.backward, c.backward);
              const double allreduce = std::max(previous.allreduce, allreduce_at(*c.measurement, replicas));
              const double v = forward + backward, current = target.forward + target.backward;
              if (v < current || (v == current && allreduce < target.allreduce))
                target = State{forward, backward, allreduce, previous_block, previous_devices};
            }
          }
        }
      }
    }
    const State& last = at(S, k, D);
    if (std::isinf(last.forward)) return split;
    split.feasible = true;
    split.max_stage_seconds = last.forward + last.backward;
    split.max_allreduce_seconds = last.allreduce;
    split.step_seconds = (M + S - 1) * split.max_stage_seconds + last.allreduce;
    split.first_block.assign(S, 0);
    split.replicas.assign(S, 0);
    for (int s = S, b = k, d = D; s >= 1; --s) {
      const State& state = at(s, b, d);
      split.first_block[s - 1] = state.from_block;
      split.replicas[s - 1] = d - state.from_devices;
      b = state.from_block;
      d = state.from_devices;
    }
    return split;
  }

  // The split behind result.best[S] of the last run (S ≥ 2 from the table, S = 1 trivially).
  void backtrack(int stages, const Cell& best, StageSplit& split) const {
    split.first_block.clear();
    split.replicas.clear();
    if (stages == 1) {
      split.first_block = {0};
      split.replicas = {best.replicas};
      return;
    }
    const int k = block_count();
    int b = 0, d = setting_.devices;
    for (int j = stages; j >= 1; --j) {
      PARTRAIN_CHECK(j < static_cast<int>(back_.size()) && b < static_cast<int>(back_[j].size()),
                     "rannc: internal error while reading the DP table");
      const BackRow& back = back_[j][b];
      const int index = d - back.first_devices;
      PARTRAIN_CHECK(index >= 0 && index < static_cast<int>(back.cells.size()),
                     "rannc: internal error while reading the DP table");
      const BackPointer& c = back.cells[index];
      PARTRAIN_CHECK(c.next_block > b && c.replicas > 0, "rannc: internal error while reading the DP table");
      split.first_block.push_back(b);
      split.replicas.push_back(c.replicas);
      b = c.next_block;
      d -= c.replicas;
    }
    PARTRAIN_CHECK(b == k && d == 0, "rannc: internal error while reading the DP table");
  }

 private:
  // Makes `setting` current: the stage costs cached per setting are dropped when it changes.
  void use_setting(const Setting& setting) {
    if (same_setting(setting)) return;
    setting_ = setting;
    for (auto& table : stage_runs_) {
      table.clear();
      table.resize(static_cast<std::size_t>(block_count() + 1) * (block_count() + 1));
    }
  }
  static bool better(double value, double allreduce, const Cell& current) {
    return value < current.value || (value == current.value && allreduce < current.allreduce);
  }
  bool same_setting(const Setting& s) const {
    return s.devices == setting_.devices && s.pipeline_replicas == setting_.pipeline_replicas && s.microbatches == setting_.microbatches &&
           s.microbatch_size == setting_.microbatch_size && s.across_nodes == setting_.across_nodes &&
           !stage_runs_[0].empty();
  }

  const std::vector<std::vector<int>>& blocks_;
  const CostModel& cost_;
  const PlannerOptions& options_;
  double usable_;
  bool zero_ = false;  // ZeRO-1: a stage's memory depends on its replica count
  BlockRanges ranges_;  // the blocks' ranges and their measurements
  const Graph* graph_ = nullptr;  // for the segmented policies' figures (choosing_)
  bool choosing_ = false;         // recompute = "auto": each stage priced under the policy it would run
  // The selective and per-layer segments of the ranges (from options.recomputation_cache, else
  // own_cache_) by (range, policy), and selective's repeated seconds by (range, batch).
  SegmentedRecomputationCache own_cache_;
  std::vector<const SegmentedRecomputation*> segments_;
  std::unordered_map<std::uint64_t, double> selective_seconds_;
  std::vector<std::vector<int>> own_tasks_;  // per block: the tasks no other block holds
  std::unordered_map<std::uint64_t, profile::Measurement> own_measurements_;
  bool lower_bound_usable_ = true;           // false once the cost model could not measure an own set
  std::vector<int> parameter_walls_;         // per block b: parameter_wall(b), −1 until computed
  Setting setting_;
  std::vector<std::vector<StageRun>> stage_runs_[2];  // [recompute][b * (k + 1) + e]
  std::vector<std::vector<BackRow>> back_;  // [j][b]: the last run's back pointers (rows j > J of it empty)
  struct Scratch {
    std::vector<Cell> previous_layer, current_layer;
    std::vector<int> dmin, dmax, sparse;
  } scratch_;  // run's tables, reused from setting to setting
};

}  // namespace

std::vector<int> stage_dp_pipeline_sizes(int world_size, int devices_per_node) {
  std::vector<int> sizes;
  for (int nodes = 1; static_cast<long>(devices_per_node) * nodes <= world_size; ++nodes) {
    const int devices = devices_per_node * nodes;
    if (world_size % devices == 0) sizes.push_back(devices);
  }
  if (sizes.empty() || sizes.back() != world_size) sizes.push_back(world_size);
  return sizes;
}

std::vector<int> stage_dp_microbatch_counts(const PlannerOptions& options, int pipeline_replicas) {
  std::vector<int> counts;
  if (options.microbatches > 0) {
    counts.push_back(options.microbatches);
    return counts;
  }
  const int most = std::max(1, options.max_microbatches);
  for (int m = 1; m <= most; m *= 2) counts.push_back(m);
  if (pipeline_replicas > 0 && options.global_batch % pipeline_replicas == 0) {
    for (std::int64_t size = 1, batch = options.global_batch / pipeline_replicas; size <= batch; size *= 2)
      if (batch % size == 0 && batch / size <= most) counts.push_back(static_cast<int>(batch / size));
  }
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  return counts;
}

namespace {

std::vector<int> pipeline_sizes(int world_size, int devices_per_node) {
  return stage_dp_pipeline_sizes(world_size, devices_per_node);
}

std::vector<int> microbatch_counts(const PlannerOptions& options, int pipeline_replicas) {
  return stage_dp_microbatch_counts(options, pipeline_replicas);
}

StageSplit make_split(const StageDp& dp, int stages, int microbatches, const StageDp::Result& result) {
  StageSplit split;
  const Cell& best = result.best[stages];
  if (best.next_block < 0) return split;
  split.feasible = true;
  split.max_stage_seconds = best.value;
  split.max_allreduce_seconds = best.allreduce;
  split.step_seconds = (microbatches + stages - 1) * best.value + best.allreduce;
  dp.backtrack(stages, best, split);
  return split;
}

// The least memory per device (before the margin) with which the blocks fit on `devices` devices
// split into equal-replica stages (S stages × r replicas = devices, one pipeline replica), or +inf.
// Used only to suggest a device count when nothing fits.
double equal_replica_memory(StageDp& dp, const PlannerOptions& options, int stages, int replicas) {
  const int k = dp.block_count();
  if (stages > k) return kInfinity;
  double least = kInfinity;
  for (int microbatches : microbatch_counts(options, 1)) {
    Setting setting;
    if (!dp.make_setting(stages * replicas, 1, microbatches, setting)) continue;
    if (setting.microbatch_size < replicas) continue;
    const std::int64_t per_replica = (setting.microbatch_size + replicas - 1) / replicas;
    // best[s][b]: least max memory of blocks b.. in the last s stages.
    std::vector<double> best(static_cast<std::size_t>(stages + 1) * (k + 1), kInfinity);
    const auto at = [&](int s, int b) -> double& { return best[s * (k + 1) + b]; };
    at(0, k) = 0;
    for (int s = 1; s <= stages; ++s) {
      const profile::MemoryPolicy policy = stage_memory_policy(options, stages - s, stages, microbatches, replicas);
      for (int b = 0; b + s <= k; ++b) {
        for (int e = b + 1; e + (s - 1) <= k; ++e) {
          if (!std::isfinite(at(s - 1, e))) continue;
          const double memory = profile::stage_memory_bytes(dp.measurement(b, e, per_replica), policy);
          at(s, b) = std::min(at(s, b), std::max(memory, at(s - 1, e)));
        }
      }
    }
    least = std::min(least, at(stages, 0));
  }
  return least;
}

// The least memory per device (before the margin) of any plan Algorithm 2 considers: Algorithm 1
// minimising stage memory instead of time. +inf when the cost model cannot measure a range it
// needs (e.g. a partial profile).
double least_plan_memory(StageDp& dp, const PlannerOptions& options, const std::vector<int>& sizes) {
  double least = kInfinity;
  try {
    for (int devices : sizes) {
      for (int microbatches : microbatch_counts(options, options.world_size / devices)) {
        Setting setting;
        if (!dp.make_setting(devices, options.world_size / devices, microbatches, setting)) continue;
        const int max_stages = options.stages > 0 ? options.stages : std::min(dp.block_count(), devices);
        if (max_stages > std::min(dp.block_count(), devices)) continue;
        const StageDp::Result result = dp.run(setting, max_stages, Objective::Memory, kInfinity, kInfinity);
        for (int S = options.stages > 0 ? options.stages : 1; S <= max_stages; ++S)
          least = std::min(least, result.best[S].value);
      }
    }
  } catch (const Error&) {
    return kInfinity;
  }
  return least;
}

// More devices allow more stages (and replicas) per pipeline: the fewest devices S × r above the
// world size with which an equal-replica split fits the usable memory. 0: none up to 65536
// devices; −1: unknown (the cost model could not measure a range).
int suggest_devices(StageDp& dp, const PlannerOptions& options, int& stages_out, int& replicas_out) {
  int suggestion = 0;
  try {
    for (int stages = 1; stages <= dp.block_count(); ++stages) {
      for (int replicas = 1; static_cast<long>(stages) * replicas <= 65536; replicas *= 2) {
        const int devices = stages * replicas;
        if (devices <= options.world_size || (suggestion > 0 && devices >= suggestion)) continue;
        if (equal_replica_memory(dp, options, stages, replicas) <= dp.usable_memory()) {
          suggestion = devices;
          stages_out = stages;
          replicas_out = replicas;
        }
      }
    }
  } catch (const Error&) {
    return -1;
  }
  return suggestion;
}

[[noreturn]] void fail_infeasible(StageDp& dp, const PlannerOptions& options, const CostModel& cost,
                                  const std::vector<int>& sizes, bool any_setting) {
  PARTRAIN_CHECK(any_setting, "rannc: the global batch " << options.global_batch
                                                         << " does not split into pipeline replicas x microbatches for "
                                                         << options.world_size << " devices (microbatches "
                                                         << (options.microbatches > 0 ? std::to_string(options.microbatches)
                                                                                      : "auto")
                                                         << ")");
  const double margin = options.memory_margin;
  std::ostringstream message;
  message << "rannc: no plan fits in " << gib_text(cost.device().memory_bytes) << " per device ("
          << gib_text(dp.usable_memory()) << " usable with memory_margin " << margin << ") on " << options.world_size
          << " devices";
  const double least = least_plan_memory(dp, options, sizes);
  if (std::isfinite(least)) message << "; the smallest device memory that would fit is " << gib_text(least / (1.0 - margin));
  if (options.stages <= 0) {
    int stages = 0, replicas = 0;
    const int suggestion = suggest_devices(dp, options, stages, replicas);
    if (suggestion > 0) {
      message << "; or use " << suggestion << " devices (e.g. " << stages << " stages x " << replicas << " replicas)";
    } else if (suggestion == 0) {
      message << "; more devices would not help with " << dp.block_count() << " blocks";
    }
  }
  PARTRAIN_FAIL(message.str());
}

}  // namespace

namespace {
// The setting of one configuration of Algorithm 1, or false when the batch does not split into it;
// throws for non-positive counts.
bool configuration_setting(const StageDp& dp, const StageDpConfig& config, Setting& setting) {
  PARTRAIN_CHECK(config.stages > 0 && config.devices > 0 && config.pipeline_replicas > 0 && config.microbatches > 0,
                 "rannc: stages, devices, pipeline_replicas and microbatches must be positive");
  return dp.make_setting(config.devices, config.pipeline_replicas, config.microbatches, setting);
}
}  // namespace

StageSplit solve_stage_dp(const std::vector<std::vector<int>>& blocks, const CostModel& cost,
                          const PlannerOptions& options, const StageDpConfig& config) {
  StageDp dp(blocks, cost, options);
  Setting setting;
  if (!configuration_setting(dp, config, setting)) return {};
  if (config.stages > std::min(dp.block_count(), config.devices)) return {};
  const StageDp::Result result = dp.run(setting, config.stages, Objective::Time, kInfinity, kInfinity);
  return make_split(dp, config.stages, config.microbatches, result);
}

namespace {

// The validated plan of one split: stages = unions of consecutive blocks, with predict_plan's figures.
Plan assemble_plan(const Graph& graph, const StageDp& dp, const CostModel& cost, const PlannerOptions& options,
                   const StageDpConfig& config, const StageSplit& split) {
  const int k = dp.block_count();
  Plan plan;
  plan.planner = "rannc";
  plan.graph_hash = graph.hash();
  plan.world_size = options.world_size;
  plan.pipeline_replicas = config.pipeline_replicas;
  plan.global_batch = options.global_batch;
  plan.microbatches = config.microbatches;
  plan.schedule = options.schedule;
  for (std::size_t s = 0; s < split.first_block.size(); ++s) {
    const int first = split.first_block[s];
    const int last = s + 1 < split.first_block.size() ? split.first_block[s + 1] : k;
    PlanStage stage;
    stage.tasks = dp.range_tasks(first, last);
    stage.replicas = split.replicas[s];
    stage.summary = summarize_tasks(graph, stage.tasks);
    plan.stages.push_back(std::move(stage));
  }
  predict_plan(plan, graph, cost, options);
  plan.validate(graph);
  return plan;
}

// Algorithm 2 around Algorithm 1 (plan_stages_rannc); std::nullopt when nothing fits and `diagnose`
// is false, the error naming what would fit when it is true.
std::optional<Plan> search_stages(const Graph& graph, const std::vector<std::vector<int>>& blocks,
                                  const CostModel& cost, const PlannerOptions& asked, bool diagnose) {
  // Interleaving with v chosen (interleaving.h): the DP searches plain 1F1B pipelines (v = 1).
  const bool choose_chunks = asked.schedule == ScheduleKind::Interleaved && asked.virtual_stages == 0;
  PlannerOptions plain = asked;
  if (choose_chunks) {
    plain.schedule = ScheduleKind::OneForwardOneBackward;
    plain.virtual_stages = 1;
  }
  const PlannerOptions& options = plain;
  StageDp dp(blocks, cost, options, &graph);
  const int k = dp.block_count();
  const std::vector<int> sizes = pipeline_sizes(options.world_size, cost.device().devices_per_node);

  PARTRAIN_CHECK(options.stages <= 0 || options.stages <= std::min(k, options.world_size),
                 "rannc: " << options.stages << " stages cannot be made from " << k << " blocks on "
                           << options.world_size << " devices");

  double best_step = options.step_seconds_bound;  // ∞ unless a better layout was found elsewhere
  StageSplit best_split;
  StageDpConfig best_config;
  bool any_setting = false;
  std::size_t total = 0;
  for (int devices : sizes) total += microbatch_counts(options, options.world_size / devices).size();
  std::size_t done = 0;
  for (int devices : sizes) {
    const int pipeline_replicas = options.world_size / devices;
    const int max_stages = options.stages > 0 ? options.stages : std::min(k, devices);
    for (int microbatches : microbatch_counts(options, pipeline_replicas)) {
      Setting setting;
      if (dp.make_setting(devices, pipeline_replicas, microbatches, setting) && max_stages <= std::min(k, devices)) {
        any_setting = true;
        double cap = kInfinity;
        for (int round = 0; round < kMaxAllreduceRounds; ++round) {
          const StageDp::Result result = dp.run(setting, max_stages, Objective::Time, cap, best_step);
          double next_cap = -kInfinity;
          for (int S = options.stages > 0 ? options.stages : 1; S <= max_stages; ++S) {
            const Cell& c = result.best[S];
            if (c.next_block < 0) continue;
            const double factor = microbatches + S - 1;
            const double step = factor * c.value + c.allreduce;
            if (step < best_step) {
              best_step = step;
              best_config = StageDpConfig{S, devices, pipeline_replicas, microbatches};
              best_split = make_split(dp, S, microbatches, result);
            }
            // A smaller all-reduce cap can only raise this S's stage time: worth another round
            // while the stage time alone still beats the best step.
            if (factor * c.value < best_step && c.allreduce > 0) next_cap = std::max(next_cap, c.allreduce);
          }
          if (!(next_cap > 0)) break;
          cap = next_cap;
        }
      }
      ++done;
      if (options.progress) options.progress(static_cast<double>(done) / static_cast<double>(total));
    }
  }
  // Interleaved pipelines whose objective beats the best plain one's (or a better layout's).
  std::optional<Plan> interleaved;
  // (The interleaved search prices every chunk with recomputation at its boundaries, one forward
  // more: at most a third above a chunk that recomputes less, as the plain DP here prices it when
  // choosing. Its bound leaves it that much room.)
  if (choose_chunks)
    interleaved = plan_interleaved_rannc(graph, blocks, cost, asked, dp.choosing() ? best_step * 4.0 / 3.0 : best_step);
  if (choose_chunks && asked.plain_objective_seconds) *asked.plain_objective_seconds = kInfinity;
  if (!best_split.feasible) {
    if (interleaved) return interleaved;
    if ((!diagnose || std::isfinite(options.step_seconds_bound)) && any_setting) return std::nullopt;
    fail_infeasible(dp, options, cost, sizes, any_setting);
  }

  Plan plan = assemble_plan(graph, dp, cost, options, best_config, best_split);
  // Algorithm 1 as printed scores a split by its largest forward plus its largest backward, which
  // tracks the fill and drain of a short pipeline better than the largest stage time does (see the
  // top of this file); its split for the same configuration is kept when the schedule's simulation
  // predicts it faster.
  Setting setting;
  if (best_config.stages > 1 && dp.make_setting(best_config.devices, best_config.pipeline_replicas, best_config.microbatches, setting)) {
    const StageSplit printed = dp.phase_maxima(setting, best_config.stages, kPhaseMaximaBudget);
    if (printed.feasible && (printed.first_block != best_split.first_block || printed.replicas != best_split.replicas)) {
      Plan other = assemble_plan(graph, dp, cost, options, best_config, printed);
      if (other.predicted_step_seconds < plan.predicted_step_seconds * (1 - 1e-12)) plan = std::move(other);
    }
  }
  if (choose_chunks && asked.plain_objective_seconds) *asked.plain_objective_seconds = interleaved_objective_seconds(plan);
  // The simulator decides between the plain and the interleaved plan (ties: plain, fewer messages).
  if (interleaved && interleaved->predicted_step_seconds < plan.predicted_step_seconds * (1 - 1e-9)) return interleaved;
  return plan;
}

}  // namespace

StageSplit solve_stage_dp_phase_maxima(const std::vector<std::vector<int>>& blocks, const CostModel& cost,
                                       const PlannerOptions& options, const StageDpConfig& config) {
  StageDp dp(blocks, cost, options);
  Setting setting;
  if (!configuration_setting(dp, config, setting)) return {};
  return dp.phase_maxima(setting, config.stages, kPhaseMaximaBudget);
}

Plan plan_stages_rannc(const Graph& graph, const std::vector<std::vector<int>>& blocks, const CostModel& cost,
                       const PlannerOptions& options) {
  std::optional<Plan> plan = search_stages(graph, blocks, cost, options, true);
  PARTRAIN_CHECK(plan.has_value(), "rannc: no plan beats a better layout's (its stage-DP step objective is "
                                       << options.step_seconds_bound << " s)");
  return *std::move(plan);
}

std::optional<Plan> try_plan_stages_rannc(const Graph& graph, const std::vector<std::vector<int>>& blocks,
                                          const CostModel& cost, const PlannerOptions& options) {
  return search_stages(graph, blocks, cost, options, false);
}

}  // namespace partrain::partition
