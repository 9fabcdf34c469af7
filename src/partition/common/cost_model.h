#pragma once
// Where planners get costs from (RaNNC §III-C; docs/planning.md §Cost models): the time and
// memory of running a convex task set for one microbatch on one device, and the time of moving
// bytes between devices. Two implementations: measured (a ProfileDB filled by distributed
// profiling) and analytic (FLOPs / device throughput, bytes / bandwidth, memory from parameter and
// activation bytes) for planning devices we cannot profile. Times in seconds, sizes in bytes.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "graph/graph.h"
#include "partition/common/kernel_timing.h"
#include "profile/communication_profile.h"
#include "profile/profile_db.h"

namespace partrain::partition {

/// The devices a plan is made for.
struct DeviceSpec {
  double flops_per_second = 1e12;     // sustained FLOP/s of one device (analytic model)
  double memory_bytes = 16.0 * (1ull << 30);
  double link_bandwidth = 100e9;      // bytes/s between devices of one node
  double network_bandwidth = 12.5e9;  // bytes/s between nodes
  int devices_per_node = 8;
  double link_latency = 0;            // seconds each collective on the node link starts with (analytic model)
  /// The GPU's kernel figures (kernel_timing.h); when enabled the analytic model prices each task by
  /// its kernels instead of at flops_per_second, and the optimizer step by its memory traffic.
  KernelModel kernels;
};

/// The tensor-parallel all-reduces of a task set of a tensor_parallel_graph (graph/tensor_parallel.h)
/// for one microbatch: the bytes its communication tasks all-reduce over the group (TaskCost's
/// forward/backward_allreduce_bytes × batch) and how many all-reduces that is, in each pass.
struct TensorParallelTraffic {
  double forward_bytes = 0;
  double backward_bytes = 0;
  int forward_allreduces = 0;
  int backward_allreduces = 0;
};

/// The traffic of `tasks` (any order, duplicates ignored) of `graph` at `batch` samples: per-sample
/// bytes of batch-dependent tasks × batch plus those of constant tasks; the vocabulary-parallel
/// cross-entropy counts as three all-reduces (max, Σ exp, target logit); under sequence parallelism
/// each all-gather or reduce-scatter counts as one collective moving half the whole tensor (it moves
/// (t − 1)/t of it per rank, half of an all-reduce; graph/ops/tensor_parallel.cpp). In mixed
/// precision the f and g all-reduces (and sequence parallelism's collectives) move bf16 activations
/// (half the graph's f32 bytes; the cross-entropy's statistics stay f32). Zero for a graph of one device. Throws partrain::Error for a task id outside the graph.
TensorParallelTraffic tensor_parallel_traffic(const Graph& graph, std::span<const int> tasks, std::int64_t batch,
                                              bool mixed_precision = false);

/// Seconds of `allreduces` ring all-reduces moving `bytes` in all over a tensor-parallel group of
/// `degree` ranks at the config's bandwidths (Megatron-LM's f/g operators; docs/parallelism.md
/// §Tensor parallelism): allreduces × link_latency + 2 (t − 1)/t × bytes / link_bandwidth, on the
/// network instead when the group is larger than a node. 0 for degree 1 or no all-reduce.
double tensor_parallel_allreduce_seconds(const DeviceSpec& device, int degree, double bytes, int allreduces);

/// Seconds of one pass (forward or backward) of a stage on a tensor-parallel graph that computes for
/// `compute_seconds` and performs `allreduces` blocking all-reduces taking `allreduce_seconds` in all.
/// Without sub-pipelining they add up (Megatron-LM's f and g stall the computation that follows).
/// With Merak's sub-pipelined TMP (`sub_pipelined`, merak.txt §6.3) the microbatch's two halves
/// alternate, one computing while the other's all-reduce runs: with n all-reduces per pass, c and a
/// the compute and communication seconds between two of them, the pass takes
/// c/2 + (n − 1/2) · max(c, a) + a/2 (§6.3's forward (1/4)T_m + (K − 1/4) max{T_m, T_a} + (1/4)T_a
/// for K transformer layers of two blocks each, n = 2K); compute and communication spread evenly
/// over the blocks, as §6.3 assumes. Equal to the sum when a = 0 or n = 0; never below
/// max(compute, allreduce). The halves' smaller GEMMs running less efficiently is not modelled.
double tensor_parallel_pass_seconds(double compute_seconds, double allreduce_seconds, int allreduces,
                                    bool sub_pipelined);

/// The same from the measured all-reduce fits of `communication` when they cover the group: a
/// group of at least `degree` ranks was measured (profile::CommunicationProfile::allreduce_seconds
/// rescales the nearest measured size, the latency paid once per all-reduce); otherwise the
/// device's bandwidths as above.
double tensor_parallel_allreduce_seconds(const profile::CommunicationProfile& communication, const DeviceSpec& device,
                                         int degree, double bytes, int allreduces);

/// Adds to `measurement`'s forward and backward seconds the tensor-parallel all-reduces of `tasks` of
/// `graph` at `batch` samples (tensor_parallel_traffic, priced by tensor_parallel_allreduce_seconds
/// from `communication` or `device`), overlapped as tensor_parallel_pass_seconds says when
/// `sub_pipelined_tmp` and the microbatch has at least 2 samples. Nothing for a graph of degree 1.
/// For cost models whose computation seconds were measured against a stand-in group.
void add_tensor_parallel_allreduces(profile::Measurement& measurement, const Graph& graph, std::span<const int> tasks,
                                    std::int64_t batch, bool mixed_precision,
                                    const profile::CommunicationProfile& communication, const DeviceSpec& device,
                                    bool sub_pipelined_tmp);

/// The part of a stage's data-parallel all-reduce (`allreduce_seconds` in all, moving
/// `parameter_bytes` of gradients) that runs while its last backward (`backward_seconds`) is still
/// computing, when the runtime all-reduces in buckets of `bucket_bytes` (runtime/bucketed_all_reduce.h,
/// PyTorch DDP's reducer): with n = ⌈parameter_bytes / bucket_bytes⌉ buckets, bucket k ready at
/// k·B/n and the buckets' all-reduces running one after another, A/n each, the last ends
/// max(A/n, A − B(1 − 1/n)) after the backward, so min(A, B)·(1 − 1/n) is hidden. 0 when
/// bucket_bytes ≤ 0 (no overlap) or one bucket.
double allreduce_hidden_seconds(double allreduce_seconds, double backward_seconds, double parameter_bytes,
                                double bucket_bytes);

/// A stage's data-parallel gradient synchronisation over `replicas` devices (across nodes or not) as
/// the runtime runs it, for `parameter_bytes` of fp32 parameters, in seconds: `reduce` runs bucket by
/// bucket during the backward (allreduce_hidden_seconds says how much of it hides there), `gather`
/// follows the optimizer step and overlaps nothing. Without ZeRO-1: one all-reduce of the fp32
/// gradients. With ZeRO-1 (`zero`; ZeRO §5.1, runtime/zero_partition.h): a reduce-scatter of the
/// fp32 gradients and an all-gather of the updated parameters, each half a ring all-reduce's
/// traffic, the all-gather in the working precision (under `mixed_precision` bf16 or fp16: half the
/// bytes, as Megatron-LM's distributed optimizer gathers them).
class CostModel;
struct GradientSynchronisation {
  double reduce = 0;  // seconds
  double gather = 0;  // seconds
  double total() const { return reduce + gather; }
  /// What is left after the stage's last backward (`backward_seconds`): the gather, and the part of
  /// the reduction that allreduce_hidden_seconds does not hide (`parameter_bytes` in buckets of `bucket_bytes`).
  double exposed_seconds(double backward_seconds, double parameter_bytes, double bucket_bytes) const;
};
GradientSynchronisation gradient_synchronisation_seconds(const CostModel& cost, double parameter_bytes, int replicas,
                                                         bool across_nodes, bool zero, bool mixed_precision);

/// Bytes of the microbatch values `values` (any order, duplicates counted once) of `graph` at `batch`
/// samples, as the runtime keeps them: f32 activations in bf16 when `mixed_precision`, every other
/// value in its own dtype (the analytic model's count of saved tensors).
double activation_bytes_of(const Graph& graph, std::span<const int> values, std::int64_t batch, bool mixed_precision);

/// A cache shared by the ranks of a node: `bytes` in all, split among `ranks`.
struct CacheShare {
  double bytes = 0;
  int ranks = 1;
};

/// Ranks of a node that share its cores: `ranks_per_node` of them, of which `concurrent_ranks` can
/// compute at full speed at once (the node's cores over each rank's threads). {0, 0}: every rank has
/// cores of its own.
struct CoreShare {
  int ranks_per_node = 0;
  double concurrent_ranks = 0;
};

/// Bytes a task set measured by `m` keeps touching from one pass to the next: its weights and
/// gradients (twice its fp32 parameter bytes) and one microbatch's working memory (peak_bytes).
/// The set's data stays cached when these fit the cache its rank has.
double cache_footprint_bytes(const profile::Measurement& m);

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
  /// The cache that Backend::flush_caches evicts, as the node that measured the costs shared it:
  /// its bytes and the ranks sharing it (bytes 0: the model does not price caches, the default).
  virtual CacheShare cache_share() const { return {}; }
  /// How the ranks of the node that measured the costs shared its cores; where they did
  /// (ranks_per_node > concurrent_ranks), the compute and optimizer costs are seconds on cores of
  /// the rank's own and the schedule simulator shares the cores (TimelineCosts). The default: each
  /// rank had its own.
  virtual CoreShare core_share() const { return {}; }
  /// measure(tasks, batch) for a rank that has `cache_bytes` of that cache to itself (the node's
  /// cache less what the other ranks' stages hold): a model that prices caches prices the set warm
  /// when its data fits them. The default ignores the cache.
  virtual profile::Measurement measure_in_cache(std::span<const int> tasks, std::int64_t batch,
                                                double cache_bytes) const {
    (void)cache_bytes;
    return measure(tasks, batch);
  }
};

/// A cost model that forwards every question to `inner` (which must outlive it): the base of
/// decorators that change one answer (the device a tensor-parallel group sees, a count of the
/// measurements asked).
class ForwardingCostModel : public CostModel {
 public:
  explicit ForwardingCostModel(const CostModel& inner) : inner_(inner) {}
  profile::Measurement measure(std::span<const int> tasks, std::int64_t batch) const override {
    return inner_.measure(tasks, batch);
  }
  double transfer_seconds(double bytes, bool across_nodes) const override {
    return inner_.transfer_seconds(bytes, across_nodes);
  }
  double allreduce_seconds(double bytes, int replicas, bool across_nodes) const override {
    return inner_.allreduce_seconds(bytes, replicas, across_nodes);
  }
  double optimizer_step_seconds(double parameter_bytes, const std::string& optimizer) const override {
    return inner_.optimizer_step_seconds(parameter_bytes, optimizer);
  }
  std::string description() const override { return inner_.description(); }
  const DeviceSpec& device() const override { return inner_.device(); }
  CacheShare cache_share() const override { return inner_.cache_share(); }
  CoreShare core_share() const override { return inner_.core_share(); }
  profile::Measurement measure_in_cache(std::span<const int> tasks, std::int64_t batch,
                                        double cache_bytes) const override {
    return inner_.measure_in_cache(tasks, batch, cache_bytes);
  }

 private:
  const CostModel& inner_;
};

/// The analytic model: forward seconds = Σ forward FLOPs · batch / flops_per_second, backward =
/// 2 × forward (gradients of inputs and of weights); parameter bytes from the Params read;
/// activation bytes = the bytes a stage keeps of a microbatch from its forward to its backward: the
/// saved tensors (graph/saved_tensors.h: what the backward rules read, Korthikanti et al. 2022 §4),
/// each value once, inputs the backward reads included; transfers at the link/network bandwidth.
/// On a tensor-parallel graph (degree t = tensor_parallel_degree(graph) > 1) each pass also pays its
/// tensor-parallel all-reduces (tensor_parallel_traffic, tensor_parallel_allreduce_seconds): they
/// block the computation that follows them (Megatron-LM's f and g), so they add to the pass's time.
/// Parameter bytes are those of the rank's shards (the graph's local shapes): nothing is divided by t.
/// With `mixed_precision` (bf16 plans) f32 activations are bf16 as the executor keeps and sends them:
/// saved tensors, boundary transfers, the largest output and the tensor-parallel all-reduces
/// count 2 bytes per f32 element; parameter bytes stay f32 (the memory model adds the bf16 copy).
/// With `sub_pipelined_tmp` (Merak's sub-pipelined TMP, recorded in the Plan) a pass of a microbatch
/// of at least 2 samples overlaps its all-reduces with computation (tensor_parallel_pass_seconds);
/// not on a sequence-parallel graph, whose all-gathers and reduce-scatters block.
std::unique_ptr<CostModel> make_analytic_cost_model(const Graph& graph, const DeviceSpec& device,
                                                    bool mixed_precision = false, bool sub_pipelined_tmp = false);

/// The measured model: looks task sets up in `database` (which must outlive it and belong to
/// `graph`: same hash, else partrain::Error); transfers as in the analytic model. On a
/// tensor-parallel graph the measurements (taken against a stand-in group that exchanges nothing)
/// get the tensor-parallel all-reduces added, priced from the database's communication profile.
/// `sub_pipelined_tmp` as for the analytic model.
std::unique_ptr<CostModel> make_profiled_cost_model(const Graph& graph, const profile::ProfileDB& database,
                                                    const DeviceSpec& device, bool sub_pipelined_tmp = false);

}  // namespace partrain::partition
