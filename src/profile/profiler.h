#pragma once
// Measures one convex task set at one microbatch size on one backend (docs/planning.md §Profiling): the
// trimmed model (only the subgraph under test, as a standalone graph) is instantiated with inputs of
// the right shape, run with warm-up and repeats, and its time and memory recorded as a
// profile::Measurement. Distributed profiling (profile/distributed_profiler.h) calls this on every
// rank for its share of the requests.
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>

#include "core/backend.h"
#include "graph/graph.h"
#include "profile/profile_db.h"

namespace partrain::profile {

struct ProfilerOptions {
  int warmup = 1;             // untimed forward + backward passes before the timed ones (>= 0)
  int repeats = 3;            // timed forward + backward passes; the median is reported (>= 1)
  /// Backend::flush_caches before every timed forward and backward: the set is timed with its
  /// parameters, inputs and saved tensors in memory, as inside a stage whose working set exceeds
  /// the cache. Passes repeated back to back would find a small set's data still cached (on the CPU,
  /// resnet-tiny's layers ran 20 % slower in a stage than their warm profile; issue 26).
  bool flush_caches = true;
  /// With flush_caches, a set is timed warm as well only when its weights and gradients (twice its
  /// fp32 parameter bytes) fit these bytes, the cache its rank has: a larger set can never run warm
  /// in a stage (partition/common/calibrated_cost_model.h), and its warm passes would be wasted.
  double warm_cache_bytes = std::numeric_limits<double>::infinity();
  /// Time each pass by the process's CPU time over its OpenMP threads instead of the wall clock:
  /// the seconds the pass takes on cores of its own, for ranks that share their node's cores (more
  /// ranks than cores), whose wall-clock passes stretch with whatever else runs (the schedule
  /// simulator shares the cores instead: TimelineCosts::concurrent_ranks_per_node). CPU backends only.
  bool cpu_time = false;
  std::uint64_t seed = 1234;  // parameters (initialize_parameters) and synthetic inputs
  /// Mixed precision as the executor runs it: float inputs and parameters in bf16 (buffers and
  /// the parameter-gradient accumulators stay f32).
  bool mixed_precision = false;
  DType compute_dtype = DType::BF16;  // the 16-bit type of mixed precision: BF16 or F16
  /// Loss task name -> the share of its label positions that real batches count (the rest are
  /// ignore_index, which the loss kernels skip); losses not named count every position. The
  /// synthetic labels follow it, so that a loss is timed at the work it does in training.
  std::map<std::string, double> counted_label_shares;
};

/// Seconds on the clock the profiler times passes by (differences only): the wall clock, or with
/// `cpu_time` this process's CPU seconds over omp_get_max_threads() (ProfilerOptions::cpu_time).
/// Throws partrain::Error when the CPU clock cannot be read.
double pass_clock_seconds(bool cpu_time);

/// Measures the convex task set `tasks` (ids of `graph`, any order, no duplicates) for one
/// microbatch of `batch` samples on `backend`.
///
/// Only the subgraph is instantiated (standalone_graph of extract_subgraph). Its inputs are filled
/// with plausible data by synthetic_input (profile/synthetic_inputs.h: token ids and labels in
/// range, labels of options.counted_label_shares ignore_index where training's are, zero attention
/// masks, normal(0, 1) floats).
/// Parameters and buffers come from initialize_parameters (names as in the full model).
///
/// Fills, at this batch: forward_seconds / backward_seconds (seconds, median of `repeats` passes
/// after `warmup` passes, each timed after the caches are flushed when options.flush_caches;
/// backward seeds every output gradient with ones), warm_forward_seconds / warm_backward_seconds
/// (with flushing: the median of a second pass right after each flushed one, with only the cores'
/// own caches flushed (Backend::flush_private_caches), at most the flushed time, or 0 when the set
/// exceeds options.warm_cache_bytes; without: the flushed fields' values), parameter_bytes (bytes of
/// the Params the tasks read, each counted once), activation_bytes (bytes kept from the forward to
/// the backward as the executor keeps them: the saved tensors of graph/saved_tensors.h, inputs
/// included), boundary_input_bytes / boundary_output_bytes (bytes of the Activation
/// values received from / sent to tasks outside the set), peak_bytes (the backend allocator's
/// high-water mark during one forward + backward minus what was live before it, with parameters,
/// inputs and gradient accumulators already allocated: working memory incl. the activations and
/// the freshly computed parameter gradients).
///
/// Side effect: resets the backend allocator's peak counter (CachingAllocator::reset_peak); its
/// current byte count is back where it was on return. Throws partrain::Error for an empty or
/// non-convex set, a non-positive batch, bad options, or a kernel failure (naming the task).
Measurement measure_task_set(const Graph& graph, std::span<const int> tasks, std::int64_t batch, Backend& backend,
                             const ProfilerOptions& options = {});

}  // namespace partrain::profile
