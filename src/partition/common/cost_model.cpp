// The analytic and the profiled cost models of partition/common/cost_model.h (RaNNC §III-C uses profiled
// figures; the analytic model plans devices that cannot be profiled).
#include "partition/common/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "graph/saved_tensors.h"
#include "graph/tensor_parallel.h"

namespace partrain::partition {

double cache_footprint_bytes(const profile::Measurement& m) { return 2 * m.parameter_bytes + m.peak_bytes; }


namespace {
// All-reduces a tensor-parallel communication task performs in a pass that moves bytes.
int allreduces_of(const Task& task) { return task.op == OpType::VocabParallelCrossEntropy ? 3 : 1; }
}  // namespace

TensorParallelTraffic tensor_parallel_traffic(const Graph& graph, std::span<const int> tasks, std::int64_t batch,
                                              bool mixed_precision) {
  std::vector<int> sorted(tasks.begin(), tasks.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  TensorParallelTraffic traffic;
  const int task_count = static_cast<int>(graph.tasks().size());
  for (int id : sorted) {
    PARTRAIN_CHECK(id >= 0 && id < task_count, "tensor-parallel traffic: task " << id << " is not in the graph ("
                                                                                 << task_count << " tasks)");
    const Task& task = graph.task(id);
    double scale = task.constant ? 1.0 : static_cast<double>(batch);
    if (mixed_precision && task.op != OpType::VocabParallelCrossEntropy) scale *= 0.5;  // bf16 activations
    if (task.cost.forward_allreduce_bytes > 0) {
      traffic.forward_bytes += task.cost.forward_allreduce_bytes * scale;
      traffic.forward_allreduces += allreduces_of(task);
    }
    if (task.cost.backward_allreduce_bytes > 0) {
      traffic.backward_bytes += task.cost.backward_allreduce_bytes * scale;
      traffic.backward_allreduces += allreduces_of(task);
    }
  }
  return traffic;
}

double tensor_parallel_allreduce_seconds(const DeviceSpec& device, int degree, double bytes, int allreduces) {
  if (degree <= 1 || allreduces <= 0) return 0.0;
  const double bandwidth = degree > device.devices_per_node ? device.network_bandwidth : device.link_bandwidth;
  return allreduces * device.link_latency + 2.0 * (degree - 1) / degree * std::max(0.0, bytes) / bandwidth;
}

double tensor_parallel_pass_seconds(double compute_seconds, double allreduce_seconds, int allreduces,
                                    bool sub_pipelined) {
  if (!sub_pipelined || allreduces <= 0 || allreduce_seconds <= 0) return compute_seconds + allreduce_seconds;
  const double n = allreduces, compute = compute_seconds / n, communication = allreduce_seconds / n;
  return compute / 2 + (n - 0.5) * std::max(compute, communication) + communication / 2;
}

double tensor_parallel_allreduce_seconds(const profile::CommunicationProfile& communication, const DeviceSpec& device,
                                         int degree, double bytes, int allreduces) {
  if (degree <= 1 || allreduces <= 0) return 0.0;
  if (communication.allreduce.empty() || communication.allreduce.rbegin()->first < degree)
    return tensor_parallel_allreduce_seconds(device, degree, bytes, allreduces);
  // The fit is affine in the bytes: n all-reduces moving B in all cost T(B) + (n − 1) T(0).
  return communication.allreduce_seconds(std::max(0.0, bytes), degree) +
         (allreduces - 1) * communication.allreduce_seconds(0.0, degree);
}

namespace {

// Transfer and all-reduce times shared by both models.
double transfer_time(const DeviceSpec& device, double bytes, bool across_nodes) {
  const double bandwidth = across_nodes ? device.network_bandwidth : device.link_bandwidth;
  return bytes <= 0 ? 0.0 : bytes / bandwidth;
}

double allreduce_time(const DeviceSpec& device, double bytes, int replicas, bool across_nodes) {
  if (replicas <= 1 || bytes <= 0) return 0.0;
  const double bandwidth = across_nodes ? device.network_bandwidth : device.link_bandwidth;
  return 2.0 * (replicas - 1) / replicas * bytes / bandwidth;
}

void check_device(const DeviceSpec& device) {
  PARTRAIN_CHECK(device.flops_per_second > 0 && device.memory_bytes > 0 && device.link_bandwidth > 0 &&
                     device.network_bandwidth > 0 && device.devices_per_node > 0,
                 "cost model: device throughput, memory, bandwidths and devices per node must be positive");
  PARTRAIN_CHECK(device.link_latency >= 0, "cost model: the link latency must not be negative");
  const KernelModel& kernels = device.kernels;
  PARTRAIN_CHECK(kernels.peak_flops >= 0 && kernels.memory_bandwidth >= 0 && kernels.multiprocessors >= 0 &&
                     kernels.gemm_efficiency > 0 && kernels.gemm_efficiency <= 1 && kernels.memory_efficiency > 0 &&
                     kernels.memory_efficiency <= 1 && kernels.kernel_seconds >= 0,
                 "cost model: kernel figures must not be negative and the efficiencies must be in (0, 1]");
}

std::string device_text(const DeviceSpec& device) {
  char text[256];
  std::snprintf(text, sizeof text, "%.3g GiB per device, link %.3g GB/s, network %.3g GB/s, %d devices per node",
                device.memory_bytes / (1ull << 30), device.link_bandwidth / 1e9, device.network_bandwidth / 1e9,
                device.devices_per_node);
  return text;
}

// Bytes of a value at `batch` samples as a + b·batch (exact for shapes with one batch dimension).
struct LinearBytes {
  double fixed = 0;
  double per_sample = 0;
};

LinearBytes value_bytes(const Value& value, bool mixed_precision) {
  // In mixed precision the executor computes, keeps and sends f32 activations as bf16.
  const bool bf16 = mixed_precision && value.type.dtype == DType::F32 && value.kind == ValueKind::Activation;
  const double element = bf16 ? 2.0 : static_cast<double>(dtype_size(value.type.dtype));
  if (!has_batch_dim(value.type.shape)) return {static_cast<double>(numel(value.type.shape)) * element, 0.0};
  const double one = static_cast<double>(numel(with_batch(value.type.shape, 1))) * element;
  const double two = static_cast<double>(numel(with_batch(value.type.shape, 2))) * element;
  return {2 * one - two, two - one};
}

}  // namespace

double allreduce_hidden_seconds(double allreduce_seconds, double backward_seconds, double parameter_bytes,
                                double bucket_bytes) {
  if (bucket_bytes <= 0 || allreduce_seconds <= 0 || backward_seconds <= 0 || parameter_bytes <= 0) return 0.0;
  const double buckets = std::ceil(parameter_bytes / bucket_bytes);
  return std::min(allreduce_seconds, backward_seconds) * (1.0 - 1.0 / buckets);
}

double GradientSynchronisation::exposed_seconds(double backward_seconds, double parameter_bytes, double bucket_bytes) const {
  return total() - allreduce_hidden_seconds(reduce, backward_seconds, parameter_bytes, bucket_bytes);
}

GradientSynchronisation gradient_synchronisation_seconds(const CostModel& cost, double parameter_bytes, int replicas,
                                                         bool across_nodes, bool zero, bool mixed_precision) {
  if (!zero) return {cost.allreduce_seconds(parameter_bytes, replicas, across_nodes), 0.0};
  const double gathered_bytes = mixed_precision ? parameter_bytes / 2 : parameter_bytes;
  return {cost.allreduce_seconds(parameter_bytes, replicas, across_nodes) / 2,
          cost.allreduce_seconds(gathered_bytes, replicas, across_nodes) / 2};
}

double activation_bytes_of(const Graph& graph, std::span<const int> values, std::int64_t batch, bool mixed_precision) {
  std::vector<int> distinct(values.begin(), values.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  double bytes = 0;
  for (int value : distinct) {
    const LinearBytes linear = value_bytes(graph.value(value), mixed_precision);
    bytes += linear.fixed + linear.per_sample * static_cast<double>(batch);
  }
  return bytes;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Analytic model
// ---------------------------------------------------------------------------------------------

class AnalyticCostModel final : public CostModel {
 public:
  AnalyticCostModel(const Graph& graph, const DeviceSpec& device, bool mixed_precision, bool sub_pipelined_tmp)
      : graph_(graph), device_(device), tensor_parallel_(tensor_parallel_degree(graph)),
        mixed_precision_(mixed_precision), sub_pipelined_tmp_(sub_pipelined_tmp && !is_sequence_parallel(graph)) {
    // (Sub-pipelining overlaps the deferrable f and g all-reduces only: sequence parallelism's block.)
    check_device(device);
    const auto& values = graph.values();
    bytes_.reserve(values.size());
    for (const Value& value : values) bytes_.push_back(value_bytes(value, mixed_precision));
    // A task's output bytes at batch 1 (TaskCost::activation_bytes, in bf16 where it applies).
    task_activation_bytes_.reserve(graph.tasks().size());
    for (const Task& task : graph.tasks()) {
      double bytes = task.cost.activation_bytes;
      if (mixed_precision) {
        bytes = 0;
        for (int output : task.outputs) bytes += bytes_[output].fixed + bytes_[output].per_sample;
      }
      task_activation_bytes_.push_back(bytes);
    }
    task_stamp_.assign(graph.tasks().size(), 0);
    value_stamp_.assign(values.size(), 0);
    activation_stamp_.assign(values.size(), 0);
  }

  profile::Measurement measure(std::span<const int> tasks, std::int64_t batch) const override {
    PARTRAIN_CHECK(batch > 0, "analytic cost model: batch must be positive, not " << batch);
    PARTRAIN_CHECK(!tasks.empty(), "analytic cost model: empty task set");
    // The cache key is the sorted distinct ids as raw bytes: exact, and O(n) for the sorted
    // task lists planners pass (no text formatting).
    std::vector<int> sorted(tasks.begin(), tasks.end());
    if (!std::is_sorted(sorted.begin(), sorted.end())) std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    const std::string key(reinterpret_cast<const char*>(sorted.data()), sorted.size() * sizeof(int));
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = cache_.find(key);
    if (found == cache_.end()) found = cache_.emplace(key, figures(sorted)).first;
    Figures& f = found->second;
    const double b = static_cast<double>(batch);
    profile::Measurement m;
    if (device_.kernels.enabled()) {
      std::tie(m.forward_seconds, m.backward_seconds) = kernel_seconds(f, sorted, batch);
    } else {
      m.forward_seconds = (f.flops_per_sample * b + f.flops_fixed) / device_.flops_per_second;
      m.backward_seconds = 2.0 * m.forward_seconds;
    }
    if (tensor_parallel_ > 1) {  // the f/g all-reduces block the pass unless sub-pipelined
      const bool overlap = sub_pipelined_tmp_ && batch >= 2;  // the executor halves only 2+ samples
      m.forward_seconds = tensor_parallel_pass_seconds(
          m.forward_seconds,
          tensor_parallel_allreduce_seconds(device_, tensor_parallel_,
                                            f.forward_allreduce.fixed + f.forward_allreduce.per_sample * b,
                                            f.forward_allreduces),
          f.forward_allreduces, overlap);
      m.backward_seconds = tensor_parallel_pass_seconds(
          m.backward_seconds,
          tensor_parallel_allreduce_seconds(device_, tensor_parallel_,
                                            f.backward_allreduce.fixed + f.backward_allreduce.per_sample * b,
                                            f.backward_allreduces),
          f.backward_allreduces, overlap);
    }
    m.parameter_bytes = f.parameter_bytes;
    m.activation_bytes = f.activation.fixed + f.activation.per_sample * b;
    m.boundary_input_bytes = f.input.fixed + f.input.per_sample * b;
    m.boundary_output_bytes = f.output.fixed + f.output.per_sample * b;
    m.peak_bytes = m.activation_bytes + std::max(f.largest_output_per_sample * b, f.largest_output_fixed);
    return m;
  }

  double transfer_seconds(double bytes, bool across_nodes) const override {
    return transfer_time(device_, bytes, across_nodes);
  }
  double allreduce_seconds(double bytes, int replicas, bool across_nodes) const override {
    return allreduce_time(device_, bytes, replicas, across_nodes);
  }
  std::string description() const override {
    char text[200];
    const KernelModel& kernels = device_.kernels;
    if (kernels.enabled())
      std::snprintf(text, sizeof text,
                    "analytic kernels (%.4g TFLOP/s peak x %.3g for GEMMs, %d multiprocessors, %.4g TB/s x %.3g, ",
                    kernels.peak_flops / 1e12, kernels.gemm_efficiency, kernels.multiprocessors,
                    kernels.memory_bandwidth / 1e12, kernels.memory_efficiency);
    else
      std::snprintf(text, sizeof text, "analytic (%.3g TFLOP/s, ", device_.flops_per_second / 1e12);
    std::string tensor_parallel;
    if (tensor_parallel_ > 1)
      tensor_parallel = ", tensor parallel " + std::to_string(tensor_parallel_) + (sub_pipelined_tmp_ ? " sub-pipelined" : "");
    return text + device_text(device_) + tensor_parallel + (mixed_precision_ ? ", bf16 activations" : "") + ")";
  }
  const DeviceSpec& device() const override { return device_; }
  double optimizer_step_seconds(double parameter_bytes, const std::string& optimizer) const override {
    if (!device_.kernels.enabled()) return 0.0;
    return optimizer_kernel_seconds(device_.kernels, parameter_bytes, optimizer, mixed_precision_);
  }

 private:
  // Batch-independent sums over a task set, from which measure() scales to any batch.
  struct Figures {
    double flops_per_sample = 0, flops_fixed = 0;
    double parameter_bytes = 0;
    LinearBytes activation;  // kept from the forward to the backward: the saved tensors
    LinearBytes input, output;
    double largest_output_per_sample = 0, largest_output_fixed = 0;
    LinearBytes forward_allreduce, backward_allreduce;  // tensor-parallel all-reduce bytes
    int forward_allreduces = 0, backward_allreduces = 0;
    // Kernel-model forward and backward seconds of the set by batch (GEMM quantization makes
    // them non-linear in the batch), filled on demand.
    std::unordered_map<std::int64_t, std::pair<double, double>> kernel_seconds;
  };

  // Called with mutex_ held. Σ task_kernel_seconds over `sorted` at `batch`, each task's figures
  // computed once per batch.
  std::pair<double, double> kernel_seconds(Figures& f, const std::vector<int>& sorted, std::int64_t batch) const {
    auto found = f.kernel_seconds.find(batch);
    if (found != f.kernel_seconds.end()) return found->second;
    std::vector<std::pair<double, double>>& tasks = task_seconds_[batch];
    if (tasks.empty()) tasks.assign(graph_.tasks().size(), {-1.0, -1.0});  // −1: not computed yet
    std::pair<double, double> sum{0.0, 0.0};
    for (int id : sorted) {
      std::pair<double, double>& seconds = tasks[id];
      if (seconds.first < 0)
        seconds = task_kernel_seconds(graph_, id, graph_.task(id).constant ? 1 : batch, device_.kernels,
                                      mixed_precision_ ? 2.0 : 4.0);
      sum.first += seconds.first;
      sum.second += seconds.second;
    }
    return f.kernel_seconds.emplace(batch, sum).first->second;
  }

  // Called with mutex_ held (uses the stamp vectors).
  // `sorted`: ascending distinct task ids.
  Figures figures(const std::vector<int>& sorted) const {
    const int task_count = static_cast<int>(graph_.tasks().size());
    PARTRAIN_CHECK(sorted.front() >= 0 && sorted.back() < task_count,
                   "analytic cost model: task " << (sorted.front() < 0 ? sorted.front() : sorted.back())
                                                << " is not in the graph (" << task_count << " tasks)");
    if (++stamp_ == 0) {  // wrapped: clear the stamps
      std::fill(task_stamp_.begin(), task_stamp_.end(), 0u);
      std::fill(value_stamp_.begin(), value_stamp_.end(), 0u);
      std::fill(activation_stamp_.begin(), activation_stamp_.end(), 0u);
      stamp_ = 1;
    }
    const unsigned mark = stamp_;
    for (int id : sorted) task_stamp_[id] = mark;
    const auto member = [&](int task) { return task >= 0 && task_stamp_[task] == mark; };

    Figures f;
    const auto keep_activation = [&](int value) {
      if (activation_stamp_[value] == mark) return;
      activation_stamp_[value] = mark;
      f.activation.fixed += bytes_[value].fixed;
      f.activation.per_sample += bytes_[value].per_sample;
    };
    if (tensor_parallel_ > 1) {
      // Fixed and per-sample parts: the traffic at batch 1 and 2.
      const TensorParallelTraffic one = tensor_parallel_traffic(graph_, sorted, 1, mixed_precision_);
      const TensorParallelTraffic two = tensor_parallel_traffic(graph_, sorted, 2, mixed_precision_);
      f.forward_allreduce = {2 * one.forward_bytes - two.forward_bytes, two.forward_bytes - one.forward_bytes};
      f.backward_allreduce = {2 * one.backward_bytes - two.backward_bytes, two.backward_bytes - one.backward_bytes};
      f.forward_allreduces = one.forward_allreduces;
      f.backward_allreduces = one.backward_allreduces;
    }
    for (int id : sorted) {
      const Task& task = graph_.task(id);
      const double output_bytes = task_activation_bytes_[id];
      if (task.constant) {
        f.flops_fixed += task.cost.forward_flops;
        f.largest_output_fixed = std::max(f.largest_output_fixed, output_bytes);
      } else {
        f.flops_per_sample += task.cost.forward_flops;
        f.largest_output_per_sample = std::max(f.largest_output_per_sample, output_bytes);
      }
      for (int input : task.inputs) {
        if (value_stamp_[input] == mark) continue;  // counted already
        const Value& value = graph_.value(input);
        if (value.kind == ValueKind::Param) {
          value_stamp_[input] = mark;
          f.parameter_bytes += bytes_[input].fixed + bytes_[input].per_sample;
        } else if (value.kind == ValueKind::Activation && !member(value.producer)) {
          value_stamp_[input] = mark;
          f.input.fixed += bytes_[input].fixed;
          f.input.per_sample += bytes_[input].per_sample;
        }
      }
      for (int output : task.outputs) {
        const Value& value = graph_.value(output);
        if (std::any_of(value.consumers.begin(), value.consumers.end(), [&](int c) { return !member(c); })) {
          f.output.fixed += bytes_[output].fixed;
          f.output.per_sample += bytes_[output].per_sample;
        }
      }
    }
    // The saved tensors (graph/saved_tensors.h, Korthikanti et al. 2022 §4): what the backward
    // reads is all the runtime keeps of a microbatch until its backward (outputs it does not read
    // go as soon as they have been sent).
    for (int value : saved_for_backward(graph_, sorted)) keep_activation(value);
    return f;
  }

  const Graph& graph_;
  DeviceSpec device_;
  int tensor_parallel_ = 1;         // the graph's tensor-parallel degree
  bool mixed_precision_ = false;    // bf16 activations
  bool sub_pipelined_tmp_ = false;  // Merak §6.3: halves overlap their all-reduces
  std::vector<LinearBytes> bytes_;  // per value
  std::vector<double> task_activation_bytes_;  // per task: output bytes at batch 1
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, Figures> cache_;
  // Kernel seconds (forward, backward) of every task by batch, computed on first use.
  mutable std::unordered_map<std::int64_t, std::vector<std::pair<double, double>>> task_seconds_;
  mutable std::vector<unsigned> task_stamp_, value_stamp_, activation_stamp_;
  mutable unsigned stamp_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Profiled model
// ---------------------------------------------------------------------------------------------

class ProfiledCostModel final : public CostModel {
 public:
  ProfiledCostModel(const Graph& graph, const profile::ProfileDB& database, const DeviceSpec& device,
                    bool sub_pipelined_tmp)
      : graph_(graph), database_(database), device_(device), tensor_parallel_(tensor_parallel_degree(graph)),
        sub_pipelined_tmp_(sub_pipelined_tmp && !is_sequence_parallel(graph)) {  // as in the analytic model
    check_device(device);
    const std::uint64_t hash = graph.hash();
    PARTRAIN_CHECK(database.graph_hash() == hash,
                   "profiled cost model: the profile database belongs to another model (graph hash "
                       << std::hex << database.graph_hash() << ", this model " << hash << std::dec
                       << "); profile again with `partrain train` or plan with the analytic model");
  }

  profile::Measurement measure(std::span<const int> tasks, std::int64_t batch) const override {
    const profile::Measurement* found = database_.find(tasks, batch);
    PARTRAIN_CHECK(found != nullptr, "not profiled: tasks " << profile::task_set_key(tasks) << " at batch " << batch
                                                            << "; run `partrain train` to profile or plan with the "
                                                               "analytic model");
    profile::Measurement m = *found;
    if (tensor_parallel_ > 1)
      add_tensor_parallel_allreduces(m, graph_, tasks, batch, database_.dtype() == "bf16" || database_.dtype() == "fp16",
                                     database_.communication(),
                                     device_, sub_pipelined_tmp_);
    return m;
  }
  double transfer_seconds(double bytes, bool across_nodes) const override {
    return transfer_time(device_, bytes, across_nodes);
  }
  double allreduce_seconds(double bytes, int replicas, bool across_nodes) const override {
    return allreduce_time(device_, bytes, replicas, across_nodes);
  }
  std::string description() const override {
    std::ostringstream text;
    text << "profiled (" << database_.backend() << ", " << database_.dtype() << ", " << database_.size()
         << " measurements, " << device_text(device_) << ")";
    return text.str();
  }
  const DeviceSpec& device() const override { return device_; }

 private:
  const Graph& graph_;
  const profile::ProfileDB& database_;
  DeviceSpec device_;
  int tensor_parallel_ = 1;
  bool sub_pipelined_tmp_ = false;
};

}  // namespace

void add_tensor_parallel_allreduces(profile::Measurement& measurement, const Graph& graph, std::span<const int> tasks,
                                    std::int64_t batch, bool mixed_precision,
                                    const profile::CommunicationProfile& communication, const DeviceSpec& device,
                                    bool sub_pipelined_tmp) {
  const int degree = tensor_parallel_degree(graph);
  if (degree <= 1) return;
  const TensorParallelTraffic traffic = tensor_parallel_traffic(graph, tasks, batch, mixed_precision);
  const bool overlap = sub_pipelined_tmp && batch >= 2;  // the executor halves only 2+ samples
  measurement.forward_seconds = tensor_parallel_pass_seconds(
      measurement.forward_seconds,
      tensor_parallel_allreduce_seconds(communication, device, degree, traffic.forward_bytes, traffic.forward_allreduces),
      traffic.forward_allreduces, overlap);
  measurement.backward_seconds = tensor_parallel_pass_seconds(
      measurement.backward_seconds,
      tensor_parallel_allreduce_seconds(communication, device, degree, traffic.backward_bytes,
                                        traffic.backward_allreduces),
      traffic.backward_allreduces, overlap);
}

std::unique_ptr<CostModel> make_analytic_cost_model(const Graph& graph, const DeviceSpec& device, bool mixed_precision,
                                                    bool sub_pipelined_tmp) {
  return std::make_unique<AnalyticCostModel>(graph, device, mixed_precision, sub_pipelined_tmp);
}

std::unique_ptr<CostModel> make_profiled_cost_model(const Graph& graph, const profile::ProfileDB& database,
                                                    const DeviceSpec& device, bool sub_pipelined_tmp) {
  return std::make_unique<ProfiledCostModel>(graph, database, device, sub_pipelined_tmp);
}

}  // namespace partrain::partition
