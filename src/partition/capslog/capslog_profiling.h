#pragma once
// CAPSlog's profiling stage on our plans (capslog.txt §III-A): each profiling partitioning becomes a
// Plan in the target run's setup, each GPU of interest in it a trimmed profiling job whose peak
// memory someone measures (app/capslog_profiling.h runs them on the ranks with the real executor),
// and the planner reads the measured peaks back. partition/ never runs anything: the measurements
// come in as data (CapslogMeasurements), and what is not measured is priced by the cost model's
// memory model ("analytic"), which the plan's cost_model text then says.
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "partition/capslog/capslog.h"
#include "partition/common/cost_model.h"
#include "partition/common/plan_builder.h"
#include "partition/common/planner_options.h"
#include "plan/plan.h"

namespace partrain::partition {

/// One trimmed profiling measurement (§III-A, model trimming): GPU `device` of the profiling
/// partitioning `plan` is instantiated and trained (forward and backward of its microbatches in
/// flight under plan.schedule, optimizer step with its state); every other GPU is trimmed and its
/// tensors replaced by dummies. The result is the GPU's allocator high-water mark in bytes.
struct CapslogProfilingJob {
  std::string key;   // capslog_job_key(plan, device)
  Plan plan;         // one replica per stage, the target's microbatches and microbatch size
  int device = 0;    // the measured GPU: its pipeline stage (= its rank in `plan`)
};

/// Measured peaks of trimmed profiling jobs by key (bytes), and the jobs the planner asked for that
/// were not measured yet (each key once, in the order asked).
class CapslogMeasurements {
 public:
  /// The measured peak, or nullptr.
  const double* find(const std::string& key) const;
  /// Adds or replaces a measured peak (bytes, finite and ≥ 0; else partrain::Error naming the key).
  void insert(const std::string& key, double peak_bytes);
  /// Records a job that is not measured (ignored when its key is measured or already requested).
  void request(const CapslogProfilingJob& job);
  /// The requested jobs, which are then forgotten.
  std::vector<CapslogProfilingJob> take_requests();
  const std::map<std::string, double>& peaks() const { return peaks_; }

 private:
  std::map<std::string, double> peaks_;
  std::vector<CapslogProfilingJob> requested_;
};

/// The measurement key of GPU `device` of `plan`: graph hash, the GPU's task set, its position and
/// the pipeline depth, microbatches, microbatch size, schedule, the GPU's recompute policy,
/// precision and optimizer — what decides the measured peak. Throws partrain::Error for a device
/// outside the plan.
std::string capslog_job_key(const Plan& plan, int device);

/// A plan of given stages and replicas with options.microbatches (> 0) microbatches, predictions
/// from `cost` (predict_plan) and no memory check: the profiling partitionings must run even where
/// the trimmed GPUs would not fit (§III-A), and the capslog planner checks memory with M_p.
/// Throws partrain::Error for options.microbatches < 1, a batch that does not split, or an invalid
/// plan (Plan::validate).
Plan capslog_plan_of(const Graph& graph, std::vector<std::vector<int>> stage_tasks, std::vector<int> replicas,
                     const CostModel& cost, const PlannerOptions& options, const std::string& planner);

/// Peaks of the profiling runs' measured GPUs (peaks[r][g]; NaN for unmeasured GPUs) and where they
/// came from.
struct CapslogPeaks {
  std::vector<std::vector<double>> peaks;
  int measured = 0;   // GPUs whose peak is a trimmed run's measurement
  int analytic = 0;   // GPUs priced by the cost model's memory model instead
  /// "N trimmed profiling runs' measured peaks", "analytic peaks (...)" or a mix, for the plan.
  std::string source() const;
};

/// The jobs of the profiling partitionings `runs` (capslog_profiling_runs over `groups`) for a
/// target of `stages` stages with `replicas` per stage and options.microbatches microbatches: each
/// run as a capslog_plan_of with one replica per stage and the target's per-replica microbatch size
/// (replica_microbatch), recompute as the target's (recompute_policy at `stages`). Throws
/// partrain::Error for bad runs or options.microbatches < 1.
std::vector<std::vector<CapslogProfilingJob>> capslog_profiling_jobs(const Graph& graph,
                                                                     const std::vector<LayerGroup>& groups,
                                                                     const std::vector<CapslogProfilingRun>& runs,
                                                                     const CostModel& cost, const PlannerOptions& options,
                                                                     int stages, const std::vector<int>& replicas);

/// The peaks of capslog_profiling_jobs: each from options.capslog_measurements when it holds the
/// job's key; otherwise the job is requested there and its GPU priced by the cost model's memory
/// model (its predicted memory_bytes in the job's plan). Without capslog_measurements, or for a
/// tensor-parallel graph (whose trimmed runs would need the stand-in tensor groups), every peak is
/// analytic.
CapslogPeaks capslog_profiling_peaks(const Graph& graph, const std::vector<LayerGroup>& groups,
                                     const std::vector<CapslogProfilingRun>& runs, const CostModel& cost,
                                     const PlannerOptions& options, int stages, const std::vector<int>& replicas);

}  // namespace partrain::partition
