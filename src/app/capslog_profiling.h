#pragma once
// CAPSlog's trimmed profiling runs on the ranks (capslog.txt §III-A): each job (one GPU of a
// profiling partitioning, partition/capslog/capslog_profiling.h) is instantiated and trained by the real
// executor on a TrimmedPipelineCommunicator, and its allocator high-water mark is the measured peak
// — the same figure `partrain train` reports as rank_peak_memory_bytes, net of what the process held
// before the stage was built. Rank 0 hands out the jobs, every rank measures its share, rank 0
// gathers the peaks.
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "graph/graph.h"
#include "io/batch_source.h"
#include "io/config.h"
#include "partition/capslog/capslog_profiling.h"

namespace partrain::app {

/// Training steps of a trimmed profiling run: the first allocates the optimizer state (lazily, in
/// its update), the second runs with it, as every later training step does.
constexpr int kCapslogProfilingSteps = 2;

/// The peak bytes of `job` measured on this process: a PipelineExecutor for GPU job.device of
/// job.plan (its stage's parameters from [train] seed, the data of `data`) on a trimmed pipeline
/// communicator, trained kCapslogProfilingSteps steps; the largest rank_peak_memory_bytes of those
/// steps minus the allocator's bytes before the executor was built. `model` is the graph the plan
/// indexes (tensor-parallel degree 1). Throws partrain::Error for a plan of another graph, or what
/// the executor throws.
double measure_trimmed_stage(const ExperimentConfig& config, const Graph& model, const partition::CapslogProfilingJob& job,
                             Backend& backend, const io::BatchSource& data);

/// Measures rank 0's `jobs` over the ranks of `world` (collective; other ranks' `jobs` are ignored):
/// rank 0 broadcasts them, rank r measures jobs r, r + size, … with measure_trimmed_stage, rank 0
/// gathers the peaks into `measurements`. `progress` (may be empty) gets rank 0's fraction done.
/// Throws partrain::Error on every rank when a job failed on any rank (naming the rank and the job).
void run_capslog_profiling(const ExperimentConfig& config, const Graph& model,
                           const std::vector<partition::CapslogProfilingJob>& jobs, comm::Communicator& world,
                           Backend& backend, partition::CapslogMeasurements& measurements,
                           const std::function<void(double)>& progress = {});

}  // namespace partrain::app
