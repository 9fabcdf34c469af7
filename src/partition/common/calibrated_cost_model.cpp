#include "partition/common/calibrated_cost_model.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <span>
#include <utility>

#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "partition/common/plan_builder.h"

namespace partrain::partition {
namespace {

std::vector<std::int64_t> calibration_batches(std::int64_t max_batch) {
  std::vector<std::int64_t> batches;
  for (std::int64_t batch = 1; batch <= max_batch; batch *= 2) batches.push_back(batch);
  if (batches.empty() || batches.back() != max_batch) batches.push_back(std::max<std::int64_t>(1, max_batch));
  return batches;
}

class CalibratedCostModel final : public CostModel {
 public:
  CalibratedCostModel(const Graph& graph, const profile::ProfileDB& database, const DeviceSpec& device,
                      bool sub_pipelined_tmp)
      // (Byte counts in the profile's precision: bf16 activations under mixed precision.)
      : graph_(graph),
        analytic_(make_analytic_cost_model(graph, device, database.dtype() == "bf16" || database.dtype() == "fp16")),
        device_(device),
        communication_(database.communication()), optimizer_seconds_per_byte_(database.optimizer_seconds_per_byte()),
        cache_bytes_per_rank_(database.cache_bytes_per_rank()), cache_sharing_ranks_(database.cache_sharing_ranks()),
        core_share_{database.sharing_ranks_per_node(), database.concurrent_ranks_per_node()},
        tensor_parallel_(tensor_parallel_degree(graph)), mixed_precision_(database.dtype() == "bf16" || database.dtype() == "fp16"),
        // (Sub-pipelining overlaps the deferrable f and g all-reduces only: sequence parallelism's block.)
        sub_pipelined_tmp_(sub_pipelined_tmp && !is_sequence_parallel(graph)) {
    PARTRAIN_CHECK(database.graph_hash() == graph.hash(),
                   "profiled costs: the ProfileDB was measured for another model (graph hash differs)");
    group_of_.assign(graph.tasks().size(), -1);
    for (const LayerGroup& group : layer_groups(graph)) {
      Group entry;
      entry.name = group.name;
      for (int task : group.tasks) {
        if (graph.task(task).constant) continue;
        group_of_[task] = static_cast<int>(groups_.size());
        entry.flops += graph.task(task).cost.forward_flops;
        ++entry.tasks;
      }
      for (std::int64_t batch : database.batches(group.tasks)) entry.measured[batch] = *database.find(group.tasks, batch);
      PARTRAIN_CHECK(!entry.measured.empty(), "profiled costs: layer " << group.name
                                                  << " was not profiled; profile it (partrain train) or plan with "
                                                     "the analytic model");
      groups_.push_back(std::move(entry));
    }
    flops_.resize(graph.tasks().size());
    for (const Task& task : graph.tasks()) flops_[task.id] = task.cost.forward_flops;
    char text[256];
    std::snprintf(text, sizeof text, "profiled (%s, %s; %zu layers, shares by FLOPs; %s; communication %s)",
                  database.backend().c_str(), database.dtype().c_str(), groups_.size(), device_text().c_str(),
                  communication_.empty() ? "from the config's bandwidths" : "measured");
    description_ = text;
  }

  // Each rank with its even share of the node's cache.
  profile::Measurement measure(std::span<const int> tasks, std::int64_t batch) const override {
    return measure_in_cache(tasks, batch, cache_bytes_per_rank_);
  }
  CacheShare cache_share() const override { return {cache_bytes_per_rank_ * cache_sharing_ranks_, cache_sharing_ranks_}; }
  CoreShare core_share() const override { return core_share_; }
  // Priced at the layers' warm times when the set's data fits `cache_bytes` (cache_footprint_bytes),
  // at their flushed times otherwise (profile/profiler.h times both).
  profile::Measurement measure_in_cache(std::span<const int> tasks, std::int64_t batch,
                                        double cache_bytes) const override {
    profile::Measurement m = analytic_->measure(tasks, batch);  // exact byte counts
    std::vector<double> share_flops(groups_.size(), 0.0);
    std::vector<int> share_tasks(groups_.size(), 0);
    for (int task : tasks) {
      const int group = group_of_[task];
      if (group < 0) continue;
      share_flops[group] += flops_[task];
      ++share_tasks[group];
    }
    m.forward_seconds = m.backward_seconds = 0;
    const std::vector<double> pending = pending_gradient_bytes(tasks);
    double transient = 0;  // measured working memory beyond the kept activations
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if (share_tasks[g] == 0) continue;
      // A layer's temporaries (attention scores, im2col buffers, the loss's softmax) come and go
      // within its forward or backward: the task set's transient peak is the largest layer's, with
      // the parameter gradients pending across it.
      transient = std::max(transient, groups_[g].transient_bytes(batch) + pending[g]);
    }
    m.peak_bytes = m.activation_bytes + transient;  // the allocator's measured high-water marks
    const bool warm = cache_bytes > 0 && cache_footprint_bytes(m) <= cache_bytes;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if (share_tasks[g] == 0) continue;
      const double share = groups_[g].flops > 0 ? share_flops[g] / groups_[g].flops
                                                : static_cast<double>(share_tasks[g]) / groups_[g].tasks;
      const auto [forward, backward] = groups_[g].seconds(batch, warm);
      m.forward_seconds += share * forward;
      m.backward_seconds += share * backward;
    }
    // Profiling ran the communication tasks against a stand-in group: add the all-reduces, from
    // the measured all-reduce fits when a group of t ranks was measured, else the config's link.
    add_tensor_parallel_allreduces(m, graph_, tasks, batch, mixed_precision_, communication_, device_,
                                   sub_pipelined_tmp_);
    return m;
  }
  // Measured on the machine when the ProfileDB holds it; the config's bandwidths otherwise.
  double transfer_seconds(double bytes, bool across_nodes) const override {
    const profile::LinkFit& link = across_nodes ? communication_.across_nodes : communication_.within_node;
    return link.measured() ? link.seconds(bytes) : analytic_->transfer_seconds(bytes, across_nodes);
  }
  double allreduce_seconds(double bytes, int replicas, bool across_nodes) const override {
    if (communication_.allreduce.empty() || (across_nodes && !communication_.across_nodes.measured()))
      return analytic_->allreduce_seconds(bytes, replicas, across_nodes);
    return communication_.allreduce_seconds(bytes, replicas);
  }
  double optimizer_step_seconds(double parameter_bytes, const std::string& optimizer) const override {
    auto found = optimizer_seconds_per_byte_.find(optimizer);
    return found == optimizer_seconds_per_byte_.end() ? 0.0 : found->second * parameter_bytes;
  }
  std::string description() const override { return description_; }
  const DeviceSpec& device() const override { return device_; }

 private:

  struct Group {
    std::string name;
    double flops = 0;
    int tasks = 0;
    std::map<std::int64_t, profile::Measurement> measured;  // by batch size
    // Measured peak minus stored activations at `batch` (bytes): linear between measured sizes,
    // proportional outside them.
    double transient_bytes(std::int64_t batch) const {
      auto transient = [](const profile::Measurement& m) { return std::max(0.0, m.peak_bytes - m.activation_bytes); };
      auto above = measured.lower_bound(batch);
      if (above != measured.end() && above->first == batch) return transient(above->second);
      if (above == measured.begin() || above == measured.end()) {
        const auto& [size, m] = above == measured.end() ? *measured.rbegin() : *above;
        return transient(m) * static_cast<double>(batch) / size;
      }
      const auto below = std::prev(above);
      const double t = static_cast<double>(batch - below->first) / (above->first - below->first);
      return transient(below->second) + t * (transient(above->second) - transient(below->second));
    }
    // Forward and backward seconds at `batch` (`warm`: the warm times where measured): linear
    // between measured sizes, proportional outside.
    std::pair<double, double> seconds(std::int64_t batch, bool warm) const {
      const auto times = [warm](const profile::Measurement& m) {
        return warm && m.warm_forward_seconds > 0 ? std::pair{m.warm_forward_seconds, m.warm_backward_seconds}
                                                  : std::pair{m.forward_seconds, m.backward_seconds};
      };
      auto above = measured.lower_bound(batch);
      if (above != measured.end() && above->first == batch) return times(above->second);
      if (above == measured.begin() || above == measured.end()) {
        const auto& [size, m] = above == measured.end() ? *measured.rbegin() : *above;
        const double scale = static_cast<double>(batch) / size;
        const auto [forward, backward] = times(m);
        return {forward * scale, backward * scale};
      }
      const auto below = std::prev(above);
      const double t = static_cast<double>(batch - below->first) / (above->first - below->first);
      const auto [low_forward, low_backward] = times(below->second);
      const auto [high_forward, high_backward] = times(above->second);
      return {low_forward + t * (high_forward - low_forward), low_backward + t * (high_backward - low_backward)};
    }
  };
  std::string device_text() const {
    char text[128];
    std::snprintf(text, sizeof text, "%.3g GiB per device", device_.memory_bytes / (1ull << 30));
    return text;
  }

  const Graph& graph_;
  std::unique_ptr<CostModel> analytic_;
  DeviceSpec device_;
  profile::CommunicationProfile communication_;
  std::map<std::string, double> optimizer_seconds_per_byte_;  // measured optimizer step cost
  double cache_bytes_per_rank_ = 0;  // the profiled node's cache per rank (0: unknown, every set from memory)
  int cache_sharing_ranks_ = 1;      // the ranks that shared it
  CoreShare core_share_;             // the profiled node's cores, where its ranks shared them
  // Per layer group, the bytes of parameter gradients pending during its backward when `tasks` run
  // as one stage. A parameter read by several layer groups (GPT's tied embedding and LM head on one
  // stage) gets a gradient from each reader's backward; the interpreter keeps the later layers'
  // contribution (in the parameter's compute dtype) until the earliest reader's backward adds its
  // own and hands the sum over (graph/interpreter.cpp, as autograd does): the groups from the
  // earliest reader up to the latest, the latest excluded (its own profile holds what it makes),
  // carry it on top of their own working memory, which their profiles, measured apart, do not see.
  std::vector<double> pending_gradient_bytes(std::span<const int> tasks) const {
    std::map<int, std::pair<int, int>> readers;  // parameter -> first and last reading group
    for (int task : tasks) {
      const int group = group_of_[task];
      if (group < 0) continue;
      for (int input : graph_.task(task).inputs) {
        if (graph_.value(input).kind != ValueKind::Param) continue;
        auto [found, inserted] = readers.emplace(input, std::pair{group, group});
        found->second = {std::min(found->second.first, group), std::max(found->second.second, group)};
      }
    }
    std::vector<double> pending(groups_.size(), 0.0);
    for (const auto& [parameter, range] : readers) {
      const double bytes = static_cast<double>(graph_.value(parameter).type.bytes(1)) * (mixed_precision_ ? 0.5 : 1.0);
      for (int g = range.first; g < range.second; ++g) pending[g] += bytes;
    }
    return pending;
  }

  std::vector<Group> groups_;
  std::vector<int> group_of_;
  std::vector<double> flops_;
  std::string description_;
  int tensor_parallel_ = 1;  // the graph's tensor-parallel degree
  bool mixed_precision_ = false;  // measured in bf16 or fp16: the tensor-parallel all-reduces move 16-bit values
  bool sub_pipelined_tmp_ = false;  // Merak §6.3: halves overlap their all-reduces
};

}  // namespace

std::vector<profile::ProfileRequest> calibration_requests(const Graph& graph, std::int64_t max_batch) {
  std::vector<profile::ProfileRequest> requests;
  for (const LayerGroup& group : layer_groups(graph))
    for (std::int64_t batch : calibration_batches(max_batch)) requests.push_back({group.tasks, batch});
  return requests;
}

std::unique_ptr<CostModel> make_calibrated_cost_model(const Graph& graph, const profile::ProfileDB& database,
                                                      const DeviceSpec& device, bool sub_pipelined_tmp) {
  return std::make_unique<CalibratedCostModel>(graph, database, device, sub_pipelined_tmp);
}

}  // namespace partrain::partition
