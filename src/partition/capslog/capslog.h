#pragma once
// CAPSlog: memory-centric partitioning for pipeline parallelism (Dreuning, Badia Liokouras,
// Ouyang, Bal, van Nieuwpoort, "CAPSlog: Scalable Memory-Centric Partitioning for Pipeline
// Parallelism"; text in ../shared/papers/capslog.txt). A model is a sequence of L layers placed
// contiguously on G GPUs (pipeline stages). CAPSlog
//   §III-A  runs trimmed *profiling partitionings* (capslog_profiling_runs) and records the peak
//           memory of the GPUs holding the layers of interest, from which it extracts per layer
//           M_i(l) (the layer alone on a GPU, criterion C1) and M_a(l) (what adding layer l to
//           {l − 1} adds, criteria C2 and C3 with n = 1) — capslog_solve_memory;
//   §III-B2 predicts a GPU's peak with mCAP's model M_p(l, m) = M_i(l) + Σ_{k=l+1..m} M_a(k)
//           (capslog_predict_memory) and places layers fill-first from GPU 0 under a memory
//           threshold (Algorithm 2, capslog_fill_first);
//   §III-B1 binary-searches the threshold between 0 and the GPU capacity (Algorithm 1,
//           capslog_recommend), O((L + G) log capacity).
// The paper's numbering: Algorithm 1 is the binary search, Algorithm 2 fill-first; the profiling
// partitionings are described in §III-A without an algorithm number. Layer indices are 0-based and
// ranges inclusive, as in the paper's Algorithm 2. Sizes are bytes.
//
// Where we deviate (each is repeated at the function and in validation/README.md):
//  - Algorithm 2 as printed loops gpu_id = 0..G − 1 and then appends the last GPU (G + 1 parts), and
//    its bound m ≤ L + gpu_id − G + 1 lets GPU gpu_id take one layer too many; we loop over GPUs
//    0..G − 2 (the text: "fill GPUs 1 to G − 2 ... all remaining layers on the last GPU") with the
//    bound that leaves one layer for every later GPU.
//  - The sequences of §III-A need a middle GPU (G ≥ 3) to isolate layers on; for G ≤ 2 we profile
//    with the partitionings of 3 GPUs (the trimmed devices are never instantiated, so this costs
//    nothing but the pipeline position of the measured ones).
//  - Our schedules keep a different number of microbatches in flight on each pipeline position
//    (1F1B: S − s). The paper's predictor has no position term, and neither has ours: a layer's
//    figures are those of the position where the paper's partitionings measure it. The validation
//    (ctest capslog_memory_prediction) reports the error this leaves on our CPU runs.
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "partition/common/planner_options.h"
#include "plan/plan.h"

namespace partrain::partition {

/// Per-layer memory figures (§III-A), in bytes, indexed by layer (pipeline order).
struct CapslogLayerMemory {
  std::vector<double> isolated;  // M_i(l): peak of a GPU holding layer l alone
  std::vector<double> added;     // M_a(l): peak({l−1, l}) − peak({l−1}); M_a(0) = 0 (never used)
  std::size_t size() const { return isolated.size(); }
};

/// One profiling partitioning (§III-A): how many consecutive layers each GPU holds (Σ = L, each
/// ≥ 1; fewer than G GPUs when the layers run out, as the paper allows for the final runs) and the
/// GPUs holding layers of interest, whose peak memory the run records (ascending). The other GPUs
/// are trimmed: their layers are not instantiated and their neighbours get dummy tensors instead.
struct CapslogProfilingRun {
  std::vector<int> layers_per_device;
  std::vector<int> measured_devices;
  bool operator==(const CapslogProfilingRun&) const = default;
};

/// The profiling partitionings of §III-A for L layers on G GPUs, in the paper's order:
///  M_i runs: [1, …, 1, L − (G − 1)] (GPUs 0..G−2 measured), then with Z the layers profiled so far
///            [Z, 1, …, 1, R], R = L − Z − (G − 2) (GPUs 1..G−2), Z += G − 2, until the final
///            [Z, 1, …, 1] (GPUs 1.. measured, possibly fewer than G GPUs);
///  M_a runs: [2, …, 2, L − 2(G − 1)] and [1, 2, …, 2, L − 2(G − 2) − 1], then pairs
///            [Z, 2, …, 2, R] and [Z − 1, 2, …, 2, R + 1] with Z += 2(G − 2), until the final
///            [Z, 2, …, 2] and [Z − 1, 2, …, 2] (a last GPU may hold 1 layer); the GPUs holding a
///            pair are measured.
/// Together they meet C1 (every layer isolated) and C2/C3 with n = 1 (every {l−1, l} together) for
/// every layer. For L = 25, 42, 48 on G = 8 this gives the paper's |P| = 8, 15, 16 (Fig. 12).
/// Deviation: G ≤ 2 uses the runs of G = 3 (the sequences need a middle GPU); with L < 3 the runs
/// are [1, …, 1] and, for L = 2, [2]. Throws partrain::Error for L < 1 or G < 1.
std::vector<CapslogProfilingRun> capslog_profiling_runs(int layers, int devices);

/// Extracts M_i and M_a (§III-A) from the recorded peaks: `peaks[r][g]` is the peak bytes of GPU g
/// in run r (entries of unmeasured GPUs are ignored and may be NaN). A measured GPU holding one layer
/// l gives M_i(l) (C1); one holding {l−1, l} gives M_a(l) = its peak − M_i(l − 1) (C2, C3 with
/// n = 1). A range measured twice keeps its first measurement. The predictor then reproduces the
/// peak of every measured GPU exactly. M_a may come out negative when two positions differ in
/// memory by more than a layer adds (the paper assumes monotonicity); it is kept as measured.
/// Throws partrain::Error for mismatched sizes, a bad run (a count < 1, Σ ≠ L, a measured GPU out of
/// range), a non-finite measured peak, or, naming the layer and criterion, a layer never isolated
/// (C1) or never measured together with its predecessor (C3).
CapslogLayerMemory capslog_solve_memory(int layers, const std::vector<CapslogProfilingRun>& runs,
                                        const std::vector<std::vector<double>>& peaks);

/// M_p(l, m) of §III-B2: the predicted peak bytes of a GPU holding layers l..m (inclusive, 0-based):
/// M_i(l) + Σ_{k=l+1..m} M_a(k). Throws partrain::Error for a bad range.
double capslog_predict_memory(const CapslogLayerMemory& memory, int first, int last);

/// Predicted peak bytes of every GPU for a split given as layer counts per GPU (Σ = L).
std::vector<double> capslog_device_memory(const CapslogLayerMemory& memory, const std::vector<int>& layers_per_device);

/// What FILL_FIRST returns: the partitioning as layer counts per GPU (each ≥ 1, Σ = L), each GPU's
/// M_p and their maximum.
struct CapslogPlacement {
  std::vector<int> layers_per_device;
  std::vector<double> device_memory_bytes;
  double peak_bytes = 0;
};

/// Algorithm 2 (FILL_FIRST): GPU 0 takes layers while M_p of its range stays ≤ `threshold`, then
/// GPUs 1..G−2 in the same manner, each taking at least one layer and leaving one for every later
/// GPU; the last GPU takes the rest. O(L + G) with prefix sums. Deviations from the printed
/// pseudo-code (see the file comment): GPUs 0..G−2 in the loop, and the bound leaves a layer for
/// each later GPU. Throws partrain::Error for G < 1, L < G or non-finite figures.
CapslogPlacement capslog_fill_first(const CapslogLayerMemory& memory, int devices, double threshold);

/// What the recommender chose.
struct CapslogPartition {
  bool fits = false;                          // a partitioning with predicted peak ≤ capacity exists
  std::vector<int> layers_per_device;         // consecutive layer counts, Σ = L
  std::vector<double> device_memory_bytes;    // M_p of each GPU
  double max_memory_bytes = 0;                // their maximum
  int budget_steps = 0;                       // FILL_FIRST calls of the binary search
};

/// Algorithm 1 (binary-search recommendation): l = 0, r = capacity (bytes, an integer); while
/// l ≤ r: threshold = ⌊(l + r)/2⌋, FILL_FIRST(threshold); a predicted peak ≤ threshold records the
/// partitioning and sets r = threshold − 1, else l = threshold + 1. Returns the last recorded
/// partitioning (fits = true). When none fits the capacity, searches again up to the largest M_p of
/// any range and returns that partitioning with fits = false, so the caller can name the memory it
/// needs. With M_a ≥ 0 and M_p(l + 1, m) ≤ M_p(l, m) (removing a stage's first layer never costs
/// memory) fill-first is exact and the result is the minimum over all C(L−1, G−1) splits of the
/// largest M_p (the paper: "guaranteed to find the partitioning with the lowest predicted peak").
/// Throws partrain::Error as capslog_fill_first.
CapslogPartition capslog_recommend(const CapslogLayerMemory& memory, int devices, std::uint64_t capacity_bytes);

/// The `capslog` planner on the model's layers (layer_groups, pipeline order). Stage count: options.stages,
/// or the smallest S dividing the world size (S ≤ L) whose plan fits. For S = 1 there is nothing to
/// partition: the one stage is priced by `cost`. For S ≥ 2 the microbatch count is fixed to
/// planning_microbatches (the profiling runs must be made in the target run's setup, §III-A), the
/// profiling partitionings of capslog_profiling_runs are priced by capslog_profiling_peaks (measured
/// by trimmed runs through options.capslog_measurements when set, else analytic), M_i / M_a solved,
/// and capslog_recommend picks the stages under the usable device memory. The plan's per-stage
/// memory_bytes are CAPSlog's M_p; times from `cost` (predict_plan). Deviations (the paper is given G
/// GPUs in one pipeline): the stage count is chosen as above, each stage gets equal data-parallel
/// replicas (equal_replicas) whose all-reduce buckets the one-replica trimmed runs do not hold, and
/// under ZeRO-1 the trimmed runs keep the whole optimizer state (M_p is then an upper bound).
/// Throws partrain::Error when no stage count fits (naming the memory the best partitioning needs)
/// or for more stages than layers.
Plan plan_capslog(const Graph& graph, const CostModel& cost, const PlannerOptions& options);

}  // namespace partrain::partition
