// CAPSlog's profiling partitionings as plans and trimmed jobs, and their peaks (measured or
// analytic). See capslog_profiling.h.
#include "partition/capslog/capslog_profiling.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "partition/common/plan_builder.h"
#include "partition/common/microbatches.h"
#include "profile/profile_db.h"

namespace partrain::partition {

const double* CapslogMeasurements::find(const std::string& key) const {
  auto found = peaks_.find(key);
  return found == peaks_.end() ? nullptr : &found->second;
}

void CapslogMeasurements::insert(const std::string& key, double peak_bytes) {
  PARTRAIN_CHECK(std::isfinite(peak_bytes) && peak_bytes >= 0,
                 "capslog: the measured peak of " << key << " is " << peak_bytes << " bytes");
  peaks_[key] = peak_bytes;
}

void CapslogMeasurements::request(const CapslogProfilingJob& job) {
  if (peaks_.count(job.key)) return;
  for (const CapslogProfilingJob& other : requested_)
    if (other.key == job.key) return;
  requested_.push_back(job);
}

std::vector<CapslogProfilingJob> CapslogMeasurements::take_requests() {
  std::vector<CapslogProfilingJob> jobs = std::move(requested_);
  requested_.clear();
  return jobs;
}

std::string capslog_job_key(const Plan& plan, int device) {
  PARTRAIN_CHECK(device >= 0 && device < static_cast<int>(plan.stages.size()),
                 "capslog: GPU " << device << " of a " << plan.stages.size() << "-stage profiling plan");
  const PlanStage& stage = plan.stages[device];
  std::ostringstream key;
  key << "capslog/" << std::hex << plan.graph_hash << std::dec << "/tasks " << profile::task_set_key(stage.tasks)
      << "/gpu " << device << " of " << plan.stages.size() << "/M " << plan.microbatches << "/b "
      << plan.microbatch_size() / stage.replicas << "/" << schedule_name(plan.schedule) << "/"
      << recompute_name(stage.recompute) << "/" << precision_name(plan.precision) << "/" << plan.optimizer;
  return key.str();
}

Plan capslog_plan_of(const Graph& graph, std::vector<std::vector<int>> stage_tasks, std::vector<int> replicas,
                     const CostModel& cost, const PlannerOptions& options, const std::string& planner) {
  PARTRAIN_CHECK(options.microbatches >= 1, planner << ": needs a fixed microbatch count, not " << options.microbatches);
  PARTRAIN_CHECK(!stage_tasks.empty() && stage_tasks.size() == replicas.size(),
                 planner << ": " << stage_tasks.size() << " stages but " << replicas.size() << " replica counts");
  Plan plan = plan_header(graph, options, planner);
  plan.microbatches = options.microbatches;
  append_stages(plan, graph, std::move(stage_tasks), replicas);
  const int devices = plan.devices_per_pipeline_replica();
  PARTRAIN_CHECK(devices > 0 && options.world_size % devices == 0,
                 planner << ": " << devices << " devices per pipeline replica do not divide the world size " << options.world_size);
  plan.pipeline_replicas = options.world_size / devices;
  plan.world_size = options.world_size;
  PARTRAIN_CHECK(options.global_batch % (static_cast<std::int64_t>(plan.pipeline_replicas) * plan.microbatches) == 0,
                 planner << ": the global batch " << options.global_batch << " does not split into "
                         << plan.pipeline_replicas << " pipeline replicas x " << plan.microbatches << " microbatches");
  predict_plan(plan, graph, cost, options);
  plan.validate(graph);
  return plan;
}

std::string CapslogPeaks::source() const {
  std::ostringstream text;
  if (analytic == 0) {
    text << measured << " trimmed profiling runs' measured peaks";
  } else if (measured == 0) {
    text << "analytic peaks of its " << analytic << " profiling GPUs (no trimmed profiling runs measured)";
  } else {
    text << measured << " measured and " << analytic << " analytic profiling peaks";
  }
  return text.str();
}

std::vector<std::vector<CapslogProfilingJob>> capslog_profiling_jobs(const Graph& graph,
                                                                     const std::vector<LayerGroup>& groups,
                                                                     const std::vector<CapslogProfilingRun>& runs,
                                                                     const CostModel& cost, const PlannerOptions& options,
                                                                     int stages, const std::vector<int>& replicas) {
  PARTRAIN_CHECK(options.microbatches >= 1, "capslog: profiling needs a fixed microbatch count, not " << options.microbatches);
  // The target's per-replica microbatch, run by one replica per stage in one pipeline replica.
  const std::int64_t batch = replica_microbatch(options, replicas.at(0), replicas, options.microbatches);
  PlannerOptions profiling = options;
  profiling.global_batch = batch * options.microbatches;
  // The trimmed GPUs run as in a pipeline of the target's depth: recompute as the target decides.
  if (profiling.recompute == "auto") profiling.recompute = recompute_name(recompute_policy(options, stages));
  std::vector<std::vector<CapslogProfilingJob>> jobs;
  for (const CapslogProfilingRun& run : runs) {
    std::vector<std::vector<int>> stage_tasks;
    std::size_t first = 0;
    for (int count : run.layers_per_device) {
      PARTRAIN_CHECK(count >= 1 && first + count <= groups.size(), "capslog: a profiling run does not fit the layers");
      stage_tasks.push_back(join_groups(groups, first, first + count));
      first += count;
    }
    PARTRAIN_CHECK(first == groups.size(), "capslog: a profiling run places " << first << " of " << groups.size() << " layers");
    profiling.world_size = static_cast<int>(stage_tasks.size());
    const Plan plan = capslog_plan_of(graph, std::move(stage_tasks), std::vector<int>(run.layers_per_device.size(), 1),
                                      cost, profiling, "capslog-profiling");
    std::vector<CapslogProfilingJob>& run_jobs = jobs.emplace_back();
    for (int device : run.measured_devices) run_jobs.push_back({capslog_job_key(plan, device), plan, device});
  }
  return jobs;
}

CapslogPeaks capslog_profiling_peaks(const Graph& graph, const std::vector<LayerGroup>& groups,
                                     const std::vector<CapslogProfilingRun>& runs, const CostModel& cost,
                                     const PlannerOptions& options, int stages, const std::vector<int>& replicas) {
  const std::vector<std::vector<CapslogProfilingJob>> jobs =
      capslog_profiling_jobs(graph, groups, runs, cost, options, stages, replicas);
  CapslogMeasurements* measurements = tensor_parallel_degree(graph) == 1 ? options.capslog_measurements : nullptr;
  CapslogPeaks result;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    std::vector<double>& peaks =
        result.peaks.emplace_back(runs[r].layers_per_device.size(), std::numeric_limits<double>::quiet_NaN());
    for (const CapslogProfilingJob& job : jobs[r]) {
      const double* measured = measurements ? measurements->find(job.key) : nullptr;
      if (measured) {
        peaks[job.device] = *measured;
        ++result.measured;
        continue;
      }
      if (measurements) measurements->request(job);
      peaks[job.device] = job.plan.stages[job.device].memory_bytes;
      ++result.analytic;
    }
  }
  return result;
}

}  // namespace partrain::partition
