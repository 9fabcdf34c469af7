// CAPSlog (Dreuning et al., PDP 2024): profiling partitionings, per-layer memory extraction, the
// M_p predictor, fill-first placement, the binary-search recommender, and the `capslog` planner.
// See capslog.h for the model and for where we had to read the paper.
#include "partition/capslog.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "core/error.h"
#include "partition/plan_builder.h"
#include "partition/uniform.h"
#include "profile/memory_model.h"

namespace partrain::partition {

namespace {

void check_in_flight(const std::vector<int>& in_flight, const char* where) {
  PARTRAIN_CHECK(!in_flight.empty(), where << ": no devices");
  for (std::size_t g = 0; g < in_flight.size(); ++g) {
    PARTRAIN_CHECK(in_flight[g] >= 1, where << ": device " << g << " has " << in_flight[g]
                                            << " microbatches in flight (must be >= 1)");
    PARTRAIN_CHECK(g == 0 || in_flight[g] <= in_flight[g - 1],
                   where << ": in-flight microbatches must not increase along the pipeline (device " << g << ": "
                         << in_flight[g] << " after " << in_flight[g - 1] << ")");
  }
}

void check_memory(const CapslogLayerMemory& memory, const char* where) {
  PARTRAIN_CHECK(memory.isolated.size() == memory.activation.size(),
                 where << ": " << memory.isolated.size() << " M_i values but " << memory.activation.size()
                       << " M_a values");
  for (std::size_t l = 0; l < memory.size(); ++l) {
    PARTRAIN_CHECK(std::isfinite(memory.isolated[l]) && memory.isolated[l] >= 0 &&
                       std::isfinite(memory.activation[l]) && memory.activation[l] >= 0,
                   where << ": layer " << l << " has M_i = " << memory.isolated[l] << ", M_a = "
                         << memory.activation[l] << " (must be finite and >= 0)");
  }
}

// Prefix sums of M_i and M_a, so that M_p of a range is O(1).
struct PrefixSums {
  std::vector<double> isolated{0.0};
  std::vector<double> activation{0.0};
  explicit PrefixSums(const CapslogLayerMemory& memory) {
    for (std::size_t l = 0; l < memory.size(); ++l) {
      isolated.push_back(isolated.back() + memory.isolated[l]);
      activation.push_back(activation.back() + memory.activation[l]);
    }
  }
  double range(int first, int last, int in_flight) const {
    return (isolated[last] - isolated[first]) + in_flight * (activation[last] - activation[first]);
  }
};

// Fill-first with precomputed prefix sums (see capslog_fill_first).
std::vector<int> fill_first(const PrefixSums& sums, int layers, const std::vector<int>& in_flight, double budget) {
  const int devices = static_cast<int>(in_flight.size());
  std::vector<int> counts(devices, 0);
  int end = layers;  // layers [end, L) are placed
  for (int g = devices - 1; g >= 1; --g) {
    // Device g takes [start, end): as far back as the budget allows, leaving one layer for each of
    // devices 0..g−1. Costs grow as start moves back (M_i, M_a ≥ 0), so stop at the first overflow.
    int start = end;
    while (start - 1 >= g && sums.range(start - 1, end, in_flight[g]) <= budget) --start;
    if (start == end) return {};
    counts[g] = end - start;
    end = start;
  }
  if (sums.range(0, end, in_flight[0]) > budget) return {};
  counts[0] = end;
  return counts;
}

// Dense least squares min ||A x − b|| by Householder QR (A: rows × cols, row-major, rows ≥ cols).
// Returns the index of the first column that is (numerically) a combination of the earlier ones,
// or −1 when A has full column rank, in which case x is filled.
int householder_least_squares(std::vector<double> a, std::vector<double> b, int rows, int cols, std::vector<double>& x) {
  auto at = [&](int r, int c) -> double& { return a[static_cast<std::size_t>(r) * cols + c]; };
  std::vector<double> column_norm(cols, 0.0);
  for (int c = 0; c < cols; ++c) {
    double sum = 0;
    for (int r = 0; r < rows; ++r) sum += at(r, c) * at(r, c);
    column_norm[c] = std::sqrt(sum);
  }
  for (int c = 0; c < cols; ++c) {
    if (c >= rows) return c;
    double norm = 0;
    for (int r = c; r < rows; ++r) norm += at(r, c) * at(r, c);
    norm = std::sqrt(norm);
    if (column_norm[c] == 0 || norm <= 1e-9 * column_norm[c]) return c;
    const double alpha = at(c, c) > 0 ? -norm : norm;
    std::vector<double> v(rows - c);
    for (int r = c; r < rows; ++r) v[r - c] = at(r, c);
    v[0] -= alpha;
    double v_norm2 = 0;
    for (double e : v) v_norm2 += e * e;
    for (int k = c; k < cols; ++k) {
      double dot = 0;
      for (int r = c; r < rows; ++r) dot += v[r - c] * at(r, k);
      const double f = 2 * dot / v_norm2;
      for (int r = c; r < rows; ++r) at(r, k) -= f * v[r - c];
    }
    double dot = 0;
    for (int r = c; r < rows; ++r) dot += v[r - c] * b[r];
    const double f = 2 * dot / v_norm2;
    for (int r = c; r < rows; ++r) b[r] -= f * v[r - c];
  }
  x.assign(cols, 0.0);
  for (int c = cols - 1; c >= 0; --c) {
    double sum = b[c];
    for (int k = c + 1; k < cols; ++k) sum -= at(c, k) * x[k];
    x[c] = sum / at(c, c);
  }
  return -1;
}

std::vector<int> repeated(int count, int value) { return std::vector<int>(std::max(0, count), value); }

}  // namespace

std::vector<int> capslog_in_flight_1f1b(int devices) {
  PARTRAIN_CHECK(devices >= 1, "capslog: " << devices << " devices (must be >= 1)");
  std::vector<int> in_flight(devices);
  for (int g = 0; g < devices; ++g) in_flight[g] = devices - g;
  return in_flight;
}

std::vector<CapslogProfilingRun> capslog_profiling_runs(int layers, int devices) {
  PARTRAIN_CHECK(devices >= 2, "capslog: profiling partitionings need at least 2 devices, not " << devices
                                   << " (one device holds the whole model: its memory is one measurement)");
  PARTRAIN_CHECK(layers >= devices, "capslog: " << layers << " layers cannot fill " << devices << " devices");
  const int L = layers, G = devices;
  std::vector<CapslogProfilingRun> runs;
  std::map<std::vector<int>, std::size_t> index;
  auto add = [&](std::vector<int> counts, std::vector<int> measured) {
    auto [found, inserted] = index.try_emplace(counts, runs.size());
    if (inserted) runs.push_back({std::move(counts), {}});
    std::vector<int>& into = runs[found->second].measured_devices;
    into.insert(into.end(), measured.begin(), measured.end());
    std::sort(into.begin(), into.end());
    into.erase(std::unique(into.begin(), into.end()), into.end());
  };
  if (L == G) {
    std::vector<int> all(G);
    for (int g = 0; g < G; ++g) all[g] = g;
    add(repeated(G, 1), all);
    return runs;
  }
  // [Z, 1, …, 1, R] for Z = 1..L−G+1 (R = L − Z − (G − 2) ≥ 1).
  for (int z = 1; z <= L - G + 1; ++z) {
    std::vector<int> counts{z};
    const std::vector<int> ones = repeated(G - 2, 1);
    counts.insert(counts.end(), ones.begin(), ones.end());
    counts.push_back(L - z - (G - 2));
    std::vector<int> measured;
    if (G <= 3) {
      for (int g = 0; g < G; ++g) measured.push_back(g);   // prefix, single, suffix
    } else if (z == 1) {
      for (int g = 0; g <= G - 2; ++g) measured.push_back(g);   // layers 0..G−2 alone
    } else if (z == L - G + 1) {
      for (int g = 1; g <= G - 1; ++g) measured.push_back(g);   // layers L−G+1..L−1 alone
    } else {
      measured = {1, G - 2};   // layer Z at m = G−1, layer Z+G−3 at m = 2
    }
    add(std::move(counts), std::move(measured));
  }
  // Two-layer sequences: layer 1 with layer 0 on device 0, layer L−2 with layer L−1 on device G−1.
  {
    std::vector<int> counts{2};
    const std::vector<int> ones = repeated(G - 2, 1);
    counts.insert(counts.end(), ones.begin(), ones.end());
    counts.push_back(L - G);
    add(std::move(counts), {0});
  }
  {
    std::vector<int> counts{L - G};
    const std::vector<int> ones = repeated(G - 2, 1);
    counts.insert(counts.end(), ones.begin(), ones.end());
    counts.push_back(2);
    add(std::move(counts), {G - 1});
  }
  return runs;
}

CapslogLayerMemory capslog_solve_memory(int layers, const std::vector<CapslogProfilingRun>& runs,
                                        const std::vector<std::vector<double>>& peaks,
                                        const std::vector<int>& in_flight) {
  const int G = static_cast<int>(in_flight.size());
  check_in_flight(in_flight, "capslog_solve_memory");
  PARTRAIN_CHECK(G >= 2, "capslog_solve_memory: per-layer figures need at least 2 devices, not " << G);
  PARTRAIN_CHECK(layers >= G, "capslog_solve_memory: " << layers << " layers cannot fill " << G << " devices");
  PARTRAIN_CHECK(runs.size() == peaks.size(),
                 "capslog_solve_memory: " << runs.size() << " runs but " << peaks.size() << " peak lists");
  struct Observation {
    int first, last, in_flight;
    double bytes;
  };
  std::vector<Observation> observations;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const CapslogProfilingRun& run = runs[r];
    PARTRAIN_CHECK(static_cast<int>(run.layers_per_device.size()) == G,
                   "capslog_solve_memory: run " << r << " places layers on " << run.layers_per_device.size()
                                                << " devices, not " << G);
    PARTRAIN_CHECK(static_cast<int>(peaks[r].size()) == G,
                   "capslog_solve_memory: run " << r << " has " << peaks[r].size() << " peaks, not " << G);
    std::vector<int> first(G + 1, 0);
    for (int g = 0; g < G; ++g) {
      PARTRAIN_CHECK(run.layers_per_device[g] >= 1,
                     "capslog_solve_memory: run " << r << " gives device " << g << " no layer");
      first[g + 1] = first[g] + run.layers_per_device[g];
    }
    PARTRAIN_CHECK(first[G] == layers,
                   "capslog_solve_memory: run " << r << " places " << first[G] << " layers, not " << layers);
    for (int g : run.measured_devices) {
      PARTRAIN_CHECK(g >= 0 && g < G, "capslog_solve_memory: run " << r << " measures device " << g
                                                                   << " of " << G);
      PARTRAIN_CHECK(std::isfinite(peaks[r][g]),
                     "capslog_solve_memory: run " << r << " device " << g << " peak is " << peaks[r][g]);
      observations.push_back({first[g], first[g + 1], in_flight[g], peaks[r][g]});
    }
  }
  // Which layers keep an M_a unknown: those seen (or placeable) at two in-flight counts.
  std::vector<bool> separable(layers, false);
  for (int l = 0; l < layers; ++l) {
    const int lowest = std::max(0, l - (layers - G)), highest = std::min(l, G - 1);
    for (int g = lowest; g <= highest; ++g)
      if (in_flight[g] != in_flight[lowest]) separable[l] = true;
    for (const Observation& o : observations)
      if (o.first <= l && l < o.last && o.in_flight != in_flight[lowest]) separable[l] = true;
  }
  // Unknowns in layer order: M_i(l), then M_a(l) when separable.
  std::vector<int> isolated_column(layers), activation_column(layers, -1);
  std::vector<int> column_layer;
  for (int l = 0; l < layers; ++l) {
    isolated_column[l] = static_cast<int>(column_layer.size());
    column_layer.push_back(l);
    if (separable[l]) {
      activation_column[l] = static_cast<int>(column_layer.size());
      column_layer.push_back(l);
    }
  }
  const int rows = static_cast<int>(observations.size()), cols = static_cast<int>(column_layer.size());
  std::vector<double> a(static_cast<std::size_t>(rows) * cols, 0.0), b(rows);
  for (int r = 0; r < rows; ++r) {
    const Observation& o = observations[r];
    for (int l = o.first; l < o.last; ++l) {
      a[static_cast<std::size_t>(r) * cols + isolated_column[l]] = 1.0;
      if (activation_column[l] >= 0) a[static_cast<std::size_t>(r) * cols + activation_column[l]] = o.in_flight;
    }
    b[r] = o.bytes;
  }
  std::vector<double> x;
  const int dependent = householder_least_squares(std::move(a), std::move(b), rows, cols, x);
  PARTRAIN_CHECK(dependent < 0, "capslog_solve_memory: the measurements do not determine M_i / M_a of layer "
                                    << column_layer[dependent]
                                    << " (it needs measurements at two different in-flight counts, or is "
                                       "never measured apart from its neighbours)");
  CapslogLayerMemory memory;
  memory.isolated.resize(layers);
  memory.activation.assign(layers, 0.0);
  double largest = 0;
  for (double value : x) largest = std::max(largest, std::abs(value));
  auto clean = [&](double value) { return std::abs(value) <= 1e-12 * largest ? 0.0 : value; };
  for (int l = 0; l < layers; ++l) {
    memory.isolated[l] = clean(x[isolated_column[l]]);
    if (activation_column[l] >= 0) memory.activation[l] = clean(x[activation_column[l]]);
  }
  return memory;
}

double capslog_predict_memory(const CapslogLayerMemory& memory, int first, int last, int in_flight) {
  PARTRAIN_CHECK(memory.isolated.size() == memory.activation.size(), "capslog_predict_memory: M_i and M_a differ in length");
  PARTRAIN_CHECK(0 <= first && first < last && last <= static_cast<int>(memory.size()),
                 "capslog_predict_memory: bad layer range [" << first << ", " << last << ") of " << memory.size());
  double isolated = 0, activation = 0;
  for (int l = first; l < last; ++l) {
    isolated += memory.isolated[l];
    activation += memory.activation[l];
  }
  return isolated + in_flight * activation;
}

std::vector<double> capslog_device_memory(const CapslogLayerMemory& memory, const std::vector<int>& layers_per_device,
                                          const std::vector<int>& in_flight) {
  PARTRAIN_CHECK(layers_per_device.size() == in_flight.size(),
                 "capslog_device_memory: " << layers_per_device.size() << " devices but " << in_flight.size()
                                           << " in-flight counts");
  std::vector<double> bytes;
  int first = 0;
  for (std::size_t g = 0; g < layers_per_device.size(); ++g) {
    bytes.push_back(capslog_predict_memory(memory, first, first + layers_per_device[g], in_flight[g]));
    first += layers_per_device[g];
  }
  PARTRAIN_CHECK(first == static_cast<int>(memory.size()),
                 "capslog_device_memory: the split places " << first << " of " << memory.size() << " layers");
  return bytes;
}

std::vector<int> capslog_fill_first(const CapslogLayerMemory& memory, const std::vector<int>& in_flight, double budget) {
  check_in_flight(in_flight, "capslog_fill_first");
  check_memory(memory, "capslog_fill_first");
  const int layers = static_cast<int>(memory.size());
  PARTRAIN_CHECK(layers >= static_cast<int>(in_flight.size()),
                 "capslog_fill_first: " << layers << " layers cannot fill " << in_flight.size() << " devices");
  return fill_first(PrefixSums(memory), layers, in_flight, budget);
}

CapslogPartition capslog_recommend(const CapslogLayerMemory& memory, const std::vector<int>& in_flight) {
  check_in_flight(in_flight, "capslog_recommend");
  check_memory(memory, "capslog_recommend");
  const int layers = static_cast<int>(memory.size());
  PARTRAIN_CHECK(layers >= static_cast<int>(in_flight.size()),
                 "capslog_recommend: " << layers << " layers cannot fill " << in_flight.size() << " devices");
  const PrefixSums sums(memory);
  CapslogPartition result;
  // Feasibility is monotone in the budget, and the order of non-negative doubles is the order of
  // their bit patterns: bisect on the patterns for the smallest budget that fits.
  const double everything = sums.range(0, layers, in_flight[0]);   // every split fits this budget
  std::uint64_t low = 0, high = std::bit_cast<std::uint64_t>(everything);
  std::vector<int> best = fill_first(sums, layers, in_flight, everything);
  ++result.budget_steps;
  PARTRAIN_CHECK(!best.empty(), "capslog_recommend: no split fits the total memory (internal error)");
  if (!fill_first(sums, layers, in_flight, 0.0).empty()) {
    high = 0;
    best = fill_first(sums, layers, in_flight, 0.0);
  }
  ++result.budget_steps;
  while (high - low > 1) {   // invariant: budget(low) infeasible (or low = 0 untested), budget(high) feasible
    const std::uint64_t middle = low + (high - low) / 2;
    std::vector<int> counts = fill_first(sums, layers, in_flight, std::bit_cast<double>(middle));
    ++result.budget_steps;
    if (counts.empty()) {
      low = middle;
    } else {
      high = middle;
      best = std::move(counts);
    }
  }
  result.layers_per_device = best;
  int first = 0;
  for (std::size_t g = 0; g < best.size(); ++g) {
    result.device_memory_bytes.push_back(sums.range(first, first + best[g], in_flight[g]));
    first += best[g];
  }
  result.max_memory_bytes = *std::max_element(result.device_memory_bytes.begin(), result.device_memory_bytes.end());
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
  std::string last_problem;
  for (int stages : stage_counts) {
    const std::vector<int> replicas = equal_replicas(options.world_size, stages);
    const int microbatches = planning_microbatches(options, stages, replicas);
    const std::int64_t batch = replica_microbatch(options, replicas[0], replicas, microbatches);
    CapslogLayerMemory memory;
    std::vector<int> in_flight(stages);
    for (int s = 0; s < stages; ++s) {
      const profile::MemoryPolicy policy = stage_memory_policy(options, s, stages, microbatches);
      in_flight[s] = std::max(1, policy.microbatches_in_flight);
    }
    const int copies = options.world_size / (stages * replicas[0]);
    const profile::MemoryPolicy policy = stage_memory_policy(options, 0, stages, microbatches, replicas[0] * copies);
    const double state_factor = profile::model_state_factor(policy);
    for (const LayerGroup& group : groups) {
      const profile::Measurement m = cost.measure(group.tasks, batch);
      if (policy.recompute) {
        // With activation recomputation an in-flight microbatch keeps only the layer's inputs; the
        // full activations exist for one microbatch at a time (an upper bound: a stage keeps just
        // its first layer's inputs).
        memory.isolated.push_back(m.parameter_bytes * state_factor + m.activation_bytes);
        memory.activation.push_back(m.boundary_input_bytes);
      } else {
        memory.isolated.push_back(m.parameter_bytes * state_factor);
        memory.activation.push_back(m.activation_bytes);
      }
    }
    const CapslogPartition partition = capslog_recommend(memory, in_flight);
    std::vector<std::vector<int>> stage_tasks;
    std::size_t first = 0;
    for (int count : partition.layers_per_device) {
      stage_tasks.push_back(join_groups(groups, first, first + count));
      first += count;
    }
    try {
      return plan_from_stages(graph, std::move(stage_tasks), replicas, cost, options, "capslog");
    } catch (const Error& error) {
      if (options.stages > 0) throw;
      last_problem = error.message();
    }
  }
  PARTRAIN_FAIL("capslog: no stage count up to " << (stage_counts.empty() ? 0 : stage_counts.back())
                                                 << " fits; with the most stages: " << last_problem);
}

}  // namespace partrain::partition
