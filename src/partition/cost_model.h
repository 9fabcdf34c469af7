#pragma once
// Where planners get costs from (RaNNC §III-C; DESIGN.md "Partitioning", "Profiling"): the time and
// memory of running a convex task set for one microbatch on one device, and the time of moving
// bytes between devices. Two implementations: measured (a ProfileDB filled by distributed
// profiling) and analytic (FLOPs / device throughput, bytes / bandwidth, memory from parameter and
// activation bytes) for planning devices we cannot profile. Times in seconds, sizes in bytes.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "graph/graph.h"
#include "profile/profile_db.h"

namespace partrain::partition {

/// The devices a plan is made for.
struct DeviceSpec {
  double flops_per_second = 1e12;     // sustained FLOP/s of one device (analytic model)
  double memory_bytes = 16.0 * (1ull << 30);
  double link_bandwidth = 100e9;      // bytes/s between devices of one node
  double network_bandwidth = 12.5e9;  // bytes/s between nodes
  int devices_per_node = 8;
};

/// Costs for planners. Implementations must be cheap to call repeatedly (cache what they can).
class CostModel {
 public:
  virtual ~CostModel() = default;
  /// Figures of one device running the task set (any order; constant tasks may be included) for one
  /// microbatch of `batch` samples. Throws partrain::Error when the model cannot tell (e.g. a task
  /// set that was not profiled).
  virtual profile::Measurement measure(std::span<const int> tasks, std::int64_t batch) const = 0;
  /// Seconds to send `bytes` from one device to another (same node or across nodes).
  virtual double transfer_seconds(double bytes, bool across_nodes) const = 0;
  /// Seconds of a ring all-reduce of `bytes` over `replicas` devices: 2 (r-1)/r · bytes / bandwidth.
  virtual double allreduce_seconds(double bytes, int replicas, bool across_nodes) const = 0;
  /// One line naming the model and its parameters, for the plan table.
  /// Seconds of one optimizer step (`optimizer`: "adamw" or "sgd") over `parameter_bytes` of fp32
  /// parameters on one device; 0 when the model does not know (the default).
  virtual double optimizer_step_seconds(double parameter_bytes, const std::string& optimizer) const {
    (void)parameter_bytes;
    (void)optimizer;
    return 0.0;
  }
  virtual std::string description() const = 0;
  virtual const DeviceSpec& device() const = 0;
};

/// The analytic model: forward seconds = Σ forward FLOPs · batch / flops_per_second, backward =
/// 2 × forward (gradients of inputs and of weights); parameter bytes from the Params read;
/// activation bytes = Σ output bytes of batch-dependent tasks; transfers at the link/network bandwidth.
std::unique_ptr<CostModel> make_analytic_cost_model(const Graph& graph, const DeviceSpec& device);

/// The measured model: looks task sets up in `database` (which must outlive it and belong to
/// `graph`: same hash, else partrain::Error); transfers as in the analytic model.
std::unique_ptr<CostModel> make_profiled_cost_model(const Graph& graph, const profile::ProfileDB& database,
                                                    const DeviceSpec& device);

}  // namespace partrain::partition
