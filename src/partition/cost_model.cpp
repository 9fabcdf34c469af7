// The analytic and the profiled cost models of partition/cost_model.h (RaNNC §III-C uses profiled
// figures; the analytic model plans devices that cannot be profiled).
#include "partition/cost_model.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace partrain::partition {

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

LinearBytes value_bytes(const Value& value) {
  const double element = static_cast<double>(dtype_size(value.type.dtype));
  if (!has_batch_dim(value.type.shape)) return {static_cast<double>(numel(value.type.shape)) * element, 0.0};
  const double one = static_cast<double>(numel(with_batch(value.type.shape, 1))) * element;
  const double two = static_cast<double>(numel(with_batch(value.type.shape, 2))) * element;
  return {2 * one - two, two - one};
}

// ---------------------------------------------------------------------------------------------
// Analytic model
// ---------------------------------------------------------------------------------------------

class AnalyticCostModel final : public CostModel {
 public:
  AnalyticCostModel(const Graph& graph, const DeviceSpec& device) : graph_(graph), device_(device) {
    check_device(device);
    const auto& values = graph.values();
    bytes_.reserve(values.size());
    for (const Value& value : values) bytes_.push_back(value_bytes(value));
    task_stamp_.assign(graph.tasks().size(), 0);
    value_stamp_.assign(values.size(), 0);
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
    const Figures& f = found->second;
    const double b = static_cast<double>(batch);
    profile::Measurement m;
    m.forward_seconds = (f.flops_per_sample * b + f.flops_fixed) / device_.flops_per_second;
    m.backward_seconds = 2.0 * m.forward_seconds;
    m.parameter_bytes = f.parameter_bytes;
    m.activation_bytes = f.activation_per_sample * b;
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
    char text[96];
    std::snprintf(text, sizeof text, "analytic (%.3g TFLOP/s, ", device_.flops_per_second / 1e12);
    return text + device_text(device_) + ")";
  }
  const DeviceSpec& device() const override { return device_; }

 private:
  // Batch-independent sums over a task set, from which measure() scales to any batch.
  struct Figures {
    double flops_per_sample = 0, flops_fixed = 0;
    double parameter_bytes = 0;
    double activation_per_sample = 0;
    LinearBytes input, output;
    double largest_output_per_sample = 0, largest_output_fixed = 0;
  };

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
      stamp_ = 1;
    }
    const unsigned mark = stamp_;
    for (int id : sorted) task_stamp_[id] = mark;
    const auto member = [&](int task) { return task >= 0 && task_stamp_[task] == mark; };

    Figures f;
    for (int id : sorted) {
      const Task& task = graph_.task(id);
      if (task.constant) {
        f.flops_fixed += task.cost.forward_flops;
        f.largest_output_fixed = std::max(f.largest_output_fixed, task.cost.activation_bytes);
      } else {
        f.flops_per_sample += task.cost.forward_flops;
        f.activation_per_sample += task.cost.activation_bytes;
        f.largest_output_per_sample = std::max(f.largest_output_per_sample, task.cost.activation_bytes);
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
    return f;
  }

  const Graph& graph_;
  DeviceSpec device_;
  std::vector<LinearBytes> bytes_;  // per value
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, Figures> cache_;
  mutable std::vector<unsigned> task_stamp_, value_stamp_;
  mutable unsigned stamp_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Profiled model
// ---------------------------------------------------------------------------------------------

class ProfiledCostModel final : public CostModel {
 public:
  ProfiledCostModel(const Graph& graph, const profile::ProfileDB& database, const DeviceSpec& device)
      : database_(database), device_(device) {
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
    return *found;
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
  const profile::ProfileDB& database_;
  DeviceSpec device_;
};

}  // namespace

std::unique_ptr<CostModel> make_analytic_cost_model(const Graph& graph, const DeviceSpec& device) {
  return std::make_unique<AnalyticCostModel>(graph, device);
}

std::unique_ptr<CostModel> make_profiled_cost_model(const Graph& graph, const profile::ProfileDB& database,
                                                    const DeviceSpec& device) {
  return std::make_unique<ProfiledCostModel>(graph, database, device);
}

}  // namespace partrain::partition
