// CAPSlog (capslog.txt §III): profiling partitionings, M_i / M_a extraction, the M_p predictor,
// fill-first placement (Algorithm 2), the binary-search recommender (Algorithm 1), and the `capslog`
// planner. See capslog.h for the model and the deviations.
#include "partition/capslog/capslog.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"
#include "partition/capslog/capslog_profiling.h"
#include "partition/common/plan_builder.h"
#include "partition/common/microbatches.h"
#include "profile/memory_model.h"

namespace partrain::partition {

namespace {

void check_memory(const CapslogLayerMemory& memory, const char* where) {
  PARTRAIN_CHECK(memory.isolated.size() == memory.added.size(),
                 where << ": " << memory.isolated.size() << " M_i values but " << memory.added.size() << " M_a values");
  PARTRAIN_CHECK(!memory.isolated.empty(), where << ": no layers");
  for (std::size_t l = 0; l < memory.size(); ++l)
    PARTRAIN_CHECK(std::isfinite(memory.isolated[l]) && std::isfinite(memory.added[l]),
                   where << ": layer " << l << " has M_i = " << memory.isolated[l] << ", M_a = " << memory.added[l]
                         << " (must be finite)");
}

// Prefix sums of M_a so that M_p(l, m) is O(1): M_p(l, m) = M_i(l) + A[m + 1] − A[l + 1].
struct Predictor {
  const CapslogLayerMemory& memory;
  std::vector<double> added_prefix{0.0};
  explicit Predictor(const CapslogLayerMemory& figures) : memory(figures) {
    for (double a : memory.added) added_prefix.push_back(added_prefix.back() + a);
  }
  double operator()(int first, int last) const {
    return memory.isolated[first] + (added_prefix[last + 1] - added_prefix[first + 1]);
  }
};

// Algorithm 2 with a precomputed predictor (see capslog_fill_first).
CapslogPlacement fill_first(const Predictor& predict, int layers, int devices, double threshold) {
  CapslogPlacement placement;
  int m = 0;
  for (int gpu = 0; gpu + 1 < devices; ++gpu) {
    const int l = m;
    m = m + 1;  // layer l is placed whatever the threshold: at least one layer per GPU
    // Adding layer m keeps a layer for each of the devices − 1 − gpu later GPUs: m ≤ L − G + gpu.
    while (m <= layers - devices + gpu) {
      if (predict(l, m) <= threshold) {
        ++m;
      } else {
        break;
      }
    }
    placement.layers_per_device.push_back(m - l);
    placement.device_memory_bytes.push_back(predict(l, m - 1));
  }
  placement.layers_per_device.push_back(layers - m);
  placement.device_memory_bytes.push_back(predict(m, layers - 1));
  placement.peak_bytes = *std::max_element(placement.device_memory_bytes.begin(), placement.device_memory_bytes.end());
  return placement;
}

// Algorithm 1 over [0, capacity]: the last partitioning whose predicted peak is ≤ the threshold.
bool binary_search(const Predictor& predict, int layers, int devices, std::uint64_t capacity, CapslogPlacement& best,
                   int& steps) {
  std::uint64_t l = 0, r = capacity;
  bool found = false;
  while (l <= r) {
    const std::uint64_t threshold = l + (r - l) / 2;  // ⌊(l + r)/2⌋ without overflow
    CapslogPlacement placement = fill_first(predict, layers, devices, static_cast<double>(threshold));
    ++steps;
    if (placement.peak_bytes <= static_cast<double>(threshold)) {
      best = std::move(placement);
      found = true;
      if (threshold == 0) break;
      r = threshold - 1;
    } else {
      l = threshold + 1;
    }
  }
  return found;
}

std::vector<int> ones(int count) { return std::vector<int>(std::max(0, count), 1); }

// The M_i runs of §III-A for G ≥ 3.
void isolated_runs(int L, int G, std::vector<CapslogProfilingRun>& runs) {
  if (L <= G) {  // P_0 with a GPU per layer (fewer than G GPUs when L < G)
    CapslogProfilingRun run{ones(L), {}};
    for (int g = 0; g < L; ++g) run.measured_devices.push_back(g);
    runs.push_back(run);
    return;
  }
  CapslogProfilingRun first{ones(G - 1), {}};  // P_0 = [1, …, 1, L − (G − 1)]
  first.layers_per_device.push_back(L - (G - 1));
  for (int g = 0; g <= G - 2; ++g) first.measured_devices.push_back(g);
  runs.push_back(first);
  int z = G - 1;  // Z = X + (G − 2) with X = 1: the layers profiled in isolation so far
  while (z < L) {
    const int remaining = L - z;
    CapslogProfilingRun run{{z}, {}};
    if (remaining <= G - 1) {  // the final [Z, 1, …, 1]
      for (int g = 1; g <= remaining; ++g) {
        run.layers_per_device.push_back(1);
        run.measured_devices.push_back(g);
      }
      runs.push_back(run);
      return;
    }
    for (int g = 1; g <= G - 2; ++g) {  // [Z, 1, …, 1, R], R = L − Z − (G − 2)
      run.layers_per_device.push_back(1);
      run.measured_devices.push_back(g);
    }
    run.layers_per_device.push_back(remaining - (G - 2));
    runs.push_back(run);
    z += G - 2;
  }
}

// One M_a run of §III-A: `prefix` layers on GPU 0 (none when 0), then pairs, then the rest on the
// last GPU; the final form when the rest fits as pairs (a last GPU may hold one layer). The GPUs
// holding a pair are measured. Returns whether this was the final form.
bool pair_run(int L, int G, int prefix, std::vector<CapslogProfilingRun>& runs) {
  CapslogProfilingRun run;
  if (prefix > 0) run.layers_per_device.push_back(prefix);
  const int gpus_left = G - static_cast<int>(run.layers_per_device.size());
  int layer = prefix;
  const bool final_form = L - prefix <= 2 * gpus_left;
  if (final_form) {
    while (layer < L) {
      const int take = std::min(2, L - layer);
      if (take == 2) run.measured_devices.push_back(static_cast<int>(run.layers_per_device.size()));
      run.layers_per_device.push_back(take);
      layer += take;
    }
  } else {
    for (int g = 0; g + 1 < gpus_left; ++g) {
      run.measured_devices.push_back(static_cast<int>(run.layers_per_device.size()));
      run.layers_per_device.push_back(2);
      layer += 2;
    }
    run.layers_per_device.push_back(L - layer);
  }
  if (!run.measured_devices.empty()) runs.push_back(run);
  return final_form;
}

// The M_a runs of §III-A for G ≥ 3: [2, …, 2, R] and [1, 2, …, 2, R'], then [Z, 2, …] and
// [Z − 1, 2, …] with Z advancing by 2(G − 2).
void pair_runs(int L, int G, std::vector<CapslogProfilingRun>& runs) {
  bool a_done = pair_run(L, G, 0, runs);
  bool b_done = L < 3 || pair_run(L, G, 1, runs);
  int z = 2 * (G - 1);  // X + 2(G − 2) with X = 2: the layers the first run's pairs cover
  while ((!a_done || !b_done) && z - 1 < L) {
    if (!a_done) a_done = z >= L || pair_run(L, G, z, runs);
    if (!b_done) b_done = pair_run(L, G, z - 1, runs);
    z += 2 * (G - 2);
  }
}

}  // namespace

std::vector<CapslogProfilingRun> capslog_profiling_runs(int layers, int devices) {
  PARTRAIN_CHECK(layers >= 1, "capslog: profiling partitionings need at least one layer, not " << layers);
  PARTRAIN_CHECK(devices >= 1, "capslog: profiling partitionings need at least one GPU, not " << devices);
  // The sequences isolate layers on the middle GPUs 1..G−2: G ≤ 2 profiles as G = 3 (capslog.h).
  const int G = std::max(devices, 3);
  std::vector<CapslogProfilingRun> runs;
  isolated_runs(layers, G, runs);
  if (layers >= 2) pair_runs(layers, G, runs);
  // The same partitioning twice (small L) is one run measuring the union of its GPUs.
  std::vector<CapslogProfilingRun> unique;
  for (CapslogProfilingRun& run : runs) {
    auto same = std::find_if(unique.begin(), unique.end(), [&](const CapslogProfilingRun& other) {
      return other.layers_per_device == run.layers_per_device;
    });
    if (same == unique.end()) {
      unique.push_back(std::move(run));
      continue;
    }
    for (int g : run.measured_devices) same->measured_devices.push_back(g);
    std::sort(same->measured_devices.begin(), same->measured_devices.end());
    same->measured_devices.erase(std::unique(same->measured_devices.begin(), same->measured_devices.end()),
                                 same->measured_devices.end());
  }
  return unique;
}

CapslogLayerMemory capslog_solve_memory(int layers, const std::vector<CapslogProfilingRun>& runs,
                                        const std::vector<std::vector<double>>& peaks) {
  PARTRAIN_CHECK(layers >= 1, "capslog_solve_memory: " << layers << " layers");
  PARTRAIN_CHECK(runs.size() == peaks.size(),
                 "capslog_solve_memory: " << runs.size() << " runs but " << peaks.size() << " peak lists");
  std::map<int, double> single, pair;  // first measurement of {l} and of {l − 1, l}, by l
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const CapslogProfilingRun& run = runs[r];
    const int devices = static_cast<int>(run.layers_per_device.size());
    PARTRAIN_CHECK(static_cast<int>(peaks[r].size()) == devices,
                   "capslog_solve_memory: run " << r << " has " << peaks[r].size() << " peaks for " << devices << " GPUs");
    std::vector<int> first(devices + 1, 0);
    for (int g = 0; g < devices; ++g) {
      PARTRAIN_CHECK(run.layers_per_device[g] >= 1, "capslog_solve_memory: run " << r << " gives GPU " << g << " no layer");
      first[g + 1] = first[g] + run.layers_per_device[g];
    }
    PARTRAIN_CHECK(first[devices] == layers,
                   "capslog_solve_memory: run " << r << " places " << first[devices] << " layers, not " << layers);
    for (int g : run.measured_devices) {
      PARTRAIN_CHECK(g >= 0 && g < devices, "capslog_solve_memory: run " << r << " measures GPU " << g << " of " << devices);
      PARTRAIN_CHECK(std::isfinite(peaks[r][g]), "capslog_solve_memory: run " << r << " GPU " << g << " peak is " << peaks[r][g]);
      const int count = run.layers_per_device[g];
      if (count == 1) single.try_emplace(first[g], peaks[r][g]);
      if (count == 2) pair.try_emplace(first[g] + 1, peaks[r][g]);
    }
  }
  CapslogLayerMemory memory;
  memory.isolated.assign(layers, 0.0);
  memory.added.assign(layers, 0.0);
  for (int l = 0; l < layers; ++l) {
    auto alone = single.find(l);
    PARTRAIN_CHECK(alone != single.end(),
                   "capslog_solve_memory: layer " << l << " is never alone on a measured GPU (criterion C1): no M_i");
    memory.isolated[l] = alone->second;
  }
  for (int l = 1; l < layers; ++l) {
    auto together = pair.find(l);
    PARTRAIN_CHECK(together != pair.end(), "capslog_solve_memory: layers " << l - 1 << " and " << l
                                                                           << " are never together on a measured GPU "
                                                                              "(criterion C3): no M_a of layer "
                                                                           << l);
    memory.added[l] = together->second - memory.isolated[l - 1];
  }
  return memory;
}

double capslog_predict_memory(const CapslogLayerMemory& memory, int first, int last) {
  PARTRAIN_CHECK(memory.isolated.size() == memory.added.size(), "capslog_predict_memory: M_i and M_a differ in length");
  PARTRAIN_CHECK(0 <= first && first <= last && last < static_cast<int>(memory.size()),
                 "capslog_predict_memory: bad layer range [" << first << ", " << last << "] of " << memory.size());
  double bytes = memory.isolated[first];
  for (int k = first + 1; k <= last; ++k) bytes += memory.added[k];
  return bytes;
}

std::vector<double> capslog_device_memory(const CapslogLayerMemory& memory, const std::vector<int>& layers_per_device) {
  std::vector<double> bytes;
  int first = 0;
  for (int count : layers_per_device) {
    PARTRAIN_CHECK(count >= 1, "capslog_device_memory: a GPU with " << count << " layers");
    bytes.push_back(capslog_predict_memory(memory, first, first + count - 1));
    first += count;
  }
  PARTRAIN_CHECK(first == static_cast<int>(memory.size()),
                 "capslog_device_memory: the split places " << first << " of " << memory.size() << " layers");
  return bytes;
}

CapslogPlacement capslog_fill_first(const CapslogLayerMemory& memory, int devices, double threshold) {
  check_memory(memory, "capslog_fill_first");
  const int layers = static_cast<int>(memory.size());
  PARTRAIN_CHECK(devices >= 1 && layers >= devices,
                 "capslog_fill_first: " << layers << " layers cannot fill " << devices << " GPUs");
  return fill_first(Predictor(memory), layers, devices, threshold);
}

CapslogPartition capslog_recommend(const CapslogLayerMemory& memory, int devices, std::uint64_t capacity_bytes) {
  check_memory(memory, "capslog_recommend");
  const int layers = static_cast<int>(memory.size());
  PARTRAIN_CHECK(devices >= 1 && layers >= devices,
                 "capslog_recommend: " << layers << " layers cannot fill " << devices << " GPUs");
  const Predictor predict(memory);
  CapslogPartition result;
  CapslogPlacement best;
  result.fits = binary_search(predict, layers, devices, capacity_bytes, best, result.budget_steps);
  if (!result.fits) {
    // Nothing fits the capacity: the same search up to the largest M_p of any range (every
    // placement's peak is one of them) gives the memory the best partitioning needs.
    double largest = 0;
    for (int l = 0; l < layers; ++l)
      for (int m = l; m < layers; ++m) largest = std::max(largest, predict(l, m));
    const bool found = binary_search(predict, layers, devices, static_cast<std::uint64_t>(std::ceil(largest)), best,
                                     result.budget_steps);
    PARTRAIN_CHECK(found, "capslog_recommend: no partitioning below the largest range's M_p (internal error)");
  }
  result.layers_per_device = best.layers_per_device;
  result.device_memory_bytes = best.device_memory_bytes;
  result.max_memory_bytes = best.peak_bytes;
  return result;
}

Plan plan_capslog(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const int layer_count = static_cast<int>(groups.size());
  PARTRAIN_CHECK(options.world_size >= 1, "capslog: world size " << options.world_size);
  std::vector<int> stage_counts;
  if (options.stages > 0) {
    PARTRAIN_CHECK(options.stages <= layer_count, "capslog: " << options.stages << " stages but the model has only "
                                                              << layer_count << " layers");
    stage_counts.push_back(options.stages);
  } else {
    for (int s = 1; s <= std::min(options.world_size, layer_count); ++s)
      if (options.world_size % s == 0) stage_counts.push_back(s);
  }
  const double usable = options.usable_memory_bytes(cost.device());
  std::string last_problem;
  for (int stages : stage_counts) {
    const std::vector<int> replicas = equal_replicas(options.world_size, stages);
    if (stages == 1) {  // one GPU holds every layer: nothing to partition
      try {
        return plan_from_stages(graph, {join_groups(groups, 0, groups.size())}, replicas, cost, options, "capslog");
      } catch (const Error& error) {
        if (options.stages > 0) throw;
        last_problem = error.message();
        continue;
      }
    }
    // The profiling runs are made in the target run's setup (§III-A): its microbatch count, fixed.
    PlannerOptions target = options;
    target.microbatches = planning_microbatches(options, stages, replicas);
    // CAPSlog's peaks are measured under one recompute policy, which the plan must then run: "auto"
    // is resolved here as for the profiling runs, not re-chosen per stage (whose memory the trimmed
    // runs did not measure).
    if (target.recompute == "auto") target.recompute = recompute_name(recompute_policy(options, stages));
    const std::vector<CapslogProfilingRun> runs = capslog_profiling_runs(layer_count, stages);
    const CapslogPeaks peaks = capslog_profiling_peaks(graph, groups, runs, cost, target, stages, replicas);
    const CapslogLayerMemory memory = capslog_solve_memory(layer_count, runs, peaks.peaks);
    const CapslogPartition partition =
        capslog_recommend(memory, stages, static_cast<std::uint64_t>(std::max(0.0, std::floor(usable))));
    if (!partition.fits) {
      std::ostringstream problem;
      problem << "capslog: " << stages << " stages need " << std::ceil(partition.max_memory_bytes / (1 << 20))
              << " MiB per device (CAPSlog's predicted peak), more than the usable "
              << std::floor(usable / (1 << 20)) << " MiB (memory_margin " << options.memory_margin << ")";
      if (options.stages > 0) PARTRAIN_FAIL(problem.str());
      last_problem = problem.str();
      continue;
    }
    std::vector<std::vector<int>> stage_tasks;
    std::size_t first = 0;
    for (int count : partition.layers_per_device) {
      stage_tasks.push_back(join_groups(groups, first, first + count));
      first += count;
    }
    Plan plan = capslog_plan_of(graph, std::move(stage_tasks), replicas, cost, target, "capslog");
    for (int s = 0; s < stages; ++s) plan.stages[s].memory_bytes = partition.device_memory_bytes[s];
    plan.cost_model += "; memory: CAPSlog M_p from " + peaks.source();
    plan.validate(graph);
    return plan;
  }
  PARTRAIN_FAIL("capslog: no stage count up to " << (stage_counts.empty() ? 0 : stage_counts.back())
                                                 << " fits; with the most stages: " << last_problem);
}

}  // namespace partrain::partition
