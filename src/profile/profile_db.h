#pragma once
// The ProfileDB: measured forward/backward time and memory of task sets (stages, blocks, layers) at
// given microbatch sizes. Distributed profiling fills it (every rank measures its share, rank 0
// gathers); planners read it through partition/common/cost_model.h. It is saved as JSON, keyed by graph
// hash, backend, dtype and the batch sizes, and reused by later runs on the same model and device.
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // declarations only: the full header costs ~3 s per translation unit

#include "profile/communication_profile.h"

namespace partrain::profile {

/// What one device needs to run a convex task set for one microbatch of `batch` samples.
/// Times in seconds, sizes in bytes.
struct Measurement {
  double forward_seconds = 0.0;        // forward pass of the microbatch
  double backward_seconds = 0.0;       // backward pass (input and parameter gradients)
  double parameter_bytes = 0.0;        // fp32 parameters the tasks read (each counted once)
  double activation_bytes = 0.0;       // bytes kept from forward to backward for the microbatch
  double boundary_input_bytes = 0.0;   // activations received from other stages for the microbatch
  double boundary_output_bytes = 0.0;  // activations sent to other stages for the microbatch
  double peak_bytes = 0.0;             // high-water mark of one forward + backward beyond parameters
                                       // and gradients (working memory, includes activation_bytes)
  /// The same passes run again right after a timed one, with their data still cached (at most the
  /// flushed times above): what a stage small enough to stay in the cache takes. 0: not measured
  /// (the cost models then use forward_seconds / backward_seconds).
  double warm_forward_seconds = 0.0;
  double warm_backward_seconds = 0.0;
};

/// The compact, readable key of a task set: sorted ids as ranges, e.g. "0-25,27,30-31". The input
/// need not be sorted; duplicates are ignored.
std::string task_set_key(std::span<const int> tasks);

/// The task ids of a task_set_key ("0-25,27" -> 0..25, 27). Throws partrain::Error on a malformed key.
std::vector<int> parse_task_set_key(const std::string& key);

/// Factors (> 0) by which a task set's measured forward and backward times are multiplied.
struct TimeCorrection {
  double forward = 1.0;
  double backward = 1.0;
};

/// Measurements by (task set, microbatch size) for one graph on one backend and dtype.
class ProfileDB {
 public:
  ProfileDB() = default;
  ProfileDB(std::uint64_t graph_hash, std::string backend, std::string dtype);

  std::uint64_t graph_hash() const { return graph_hash_; }
  const std::string& backend() const { return backend_; }   // e.g. "cpu", "cuda:H100"
  const std::string& dtype() const { return dtype_; }       // "fp32", "bf16" or "fp16"
  std::size_t size() const { return entries_.size(); }

  /// Adds or replaces the measurement of `tasks` at `batch` samples per microbatch.
  void insert(std::span<const int> tasks, std::int64_t batch, const Measurement& measurement);
  /// The measurement, or nullptr when it was not profiled.
  const Measurement* find(std::span<const int> tasks, std::int64_t batch) const;
  /// The microbatch sizes at which `tasks` was measured, ascending.
  std::vector<std::int64_t> batches(std::span<const int> tasks) const;
  /// Measured point-to-point and all-reduce costs of the machine (empty until measured).
  const CommunicationProfile& communication() const { return communication_; }
  void set_communication(CommunicationProfile communication) { communication_ = std::move(communication); }
  /// Measured seconds per fp32 parameter byte of one optimizer step, by optimizer ("adamw", "sgd");
  /// absent until measured.
  const std::map<std::string, double>& optimizer_seconds_per_byte() const { return optimizer_seconds_per_byte_; }
  void set_optimizer_seconds_per_byte(const std::string& optimizer, double seconds) {
    optimizer_seconds_per_byte_[optimizer] = seconds;
  }
  /// Peak bytes of trimmed stage runs by their key (CAPSlog's profiling partitionings: the key is
  /// partition::capslog_job_key, the runs app/capslog_profiling.h); cached with the layers.
  const std::map<std::string, double>& stage_peak_bytes() const { return stage_peak_bytes_; }
  void set_stage_peak_bytes(const std::string& key, double bytes) { stage_peak_bytes_[key] = bytes; }
  /// The speed calibration measured with the layers (profile/speed_calibration.h; 0 = none): a
  /// later run compares its own to tell a cache measured under other load or clocks.
  double calibration_seconds() const { return calibration_seconds_; }
  void set_calibration_seconds(double seconds) { calibration_seconds_ = seconds; }
  /// Cores that other processes kept busy per node while the layers were measured
  /// (profile/machine_load.h); −1 = not recorded (older caches). A later run compares its own to
  /// tell other load from run-to-run noise.
  double other_load_cores() const { return other_load_cores_; }
  void set_other_load_cores(double cores) { other_load_cores_ = cores; }
  /// Bytes of the cache that Backend::flush_caches evicts, per rank that shares it while the layers
  /// were measured (a CPU's last-level cache over the ranks per node; a GPU's L2); 0 = unknown. A
  /// stage whose data fits it is priced at the warm times (partition/common/calibrated_cost_model.h).
  double cache_bytes_per_rank() const { return cache_bytes_per_rank_; }
  /// The ranks that shared that cache (the node's ranks on a CPU, 1 on a GPU).
  int cache_sharing_ranks() const { return cache_sharing_ranks_; }
  void set_cache_bytes_per_rank(double bytes, int sharing_ranks = 1) {
    cache_bytes_per_rank_ = bytes;
    cache_sharing_ranks_ = sharing_ranks;
  }
  /// Where the ranks measuring shared their node's cores (a CPU node with more ranks than cores
  /// over threads): the ranks per node and how many of them can compute at full speed at once (its
  /// cores over each rank's threads). Then every time is seconds of the rank's CPU time over its
  /// threads, what it takes on cores of its own (ProfilerOptions::cpu_time), and the plan's
  /// simulator shares the cores (TimelineCosts::concurrent_ranks_per_node). 0, 0: each rank had
  /// cores of its own, and times are wall-clock seconds.
  int sharing_ranks_per_node() const { return sharing_ranks_per_node_; }
  double concurrent_ranks_per_node() const { return concurrent_ranks_per_node_; }
  void set_core_sharing(int ranks_per_node, double concurrent_ranks) {
    sharing_ranks_per_node_ = ranks_per_node;
    concurrent_ranks_per_node_ = concurrent_ranks;
  }
  /// Multiplies every measured time (forward, backward, optimizer step) by `factor` > 0: a cache
  /// measured at another speed, rescaled by the ratio of the speed calibrations.
  void rescale_times(double factor);
  /// Multiplies each measurement's forward and backward times by the factors
  /// `correction_of(tasks, batch)` returns for it: costs measured during training put back into the
  /// profile (app/replanning.h). Throws partrain::Error for a factor that is not positive.
  void correct_times(const std::function<TimeCorrection(std::span<const int> tasks, std::int64_t batch)>& correction_of);
  /// Merges another DB of the same graph/backend/dtype (throws partrain::Error otherwise).
  void merge(const ProfileDB& other);

  nlohmann::json to_json() const;
  /// Parses to_json()'s form; `source_name` names the file in errors. Throws partrain::Error.
  static ProfileDB from_json(const nlohmann::json& document, const std::string& source_name);
  /// Writes the JSON to `path` through a temporary file and a rename (never a half-written file).
  void save(const std::string& path) const;
  /// Reads a saved DB. Throws partrain::Error naming the file when unreadable or malformed.
  static ProfileDB load(const std::string& path);

  /// The file name under which a DB of this key is cached: "profile-<hash hex>-<backend>-<dtype>.json".
  static std::string cache_file_name(std::uint64_t graph_hash, const std::string& backend, const std::string& dtype);

 private:
  std::uint64_t graph_hash_ = 0;
  std::string backend_ = "cpu";
  std::string dtype_ = "fp32";
  std::map<std::pair<std::string, std::int64_t>, Measurement> entries_;
  CommunicationProfile communication_;
  std::map<std::string, double> optimizer_seconds_per_byte_;
  std::map<std::string, double> stage_peak_bytes_;
  double cache_bytes_per_rank_ = 0;
  int cache_sharing_ranks_ = 1;
  int sharing_ranks_per_node_ = 0;
  double concurrent_ranks_per_node_ = 0;
  double calibration_seconds_ = 0;
  double other_load_cores_ = -1;
};

}  // namespace partrain::profile
