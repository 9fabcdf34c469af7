// Reader of PipeDream per-layer profiles, the layer graph built from one, and the cost model that
// answers from its measurements (see pipedream_profile.h and ctest/data/pipedream-profiles/FORMAT.md).
#include "partition/common/pipedream_profile.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "profile/profile_db.h"

namespace partrain::partition {

namespace {

std::string trim(const std::string& text) {
  std::size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::vector<std::string> split(const std::string& text, const std::string& separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = text.find(separator, start);
    if (at == std::string::npos) {
      parts.push_back(text.substr(start));
      return parts;
    }
    parts.push_back(text.substr(start, at - start));
    start = at + separator.size();
  }
}

// A whole-string number, or false.
bool parse_number(const std::string& text, double& value) {
  const std::string t = trim(text);
  if (t.empty()) return false;
  char* end = nullptr;
  errno = 0;
  value = std::strtod(t.c_str(), &end);
  return errno == 0 && end == t.c_str() + t.size();
}

// "123" or "[1.0; 2.0]" (summed).
bool parse_sum(const std::string& text, double& value) {
  const std::string t = trim(text);
  if (t.size() >= 2 && t.front() == '[' && t.back() == ']') {
    value = 0;
    for (const std::string& part : split(t.substr(1, t.size() - 2), ";")) {
      double element = 0;
      if (!parse_number(part, element)) return false;
      value += element;
    }
    return true;
  }
  return parse_number(t, value);
}

// The number at the end of a node id ("node12" -> 12), -1 when none.
long id_number(const std::string& id) {
  std::size_t digits = id.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(id[digits - 1]))) --digits;
  if (digits == id.size() || id.size() - digits > 15) return -1;
  return std::stol(id.substr(digits));
}

}  // namespace

int PipeDreamProfile::find(const std::string& id) const {
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].id == id) return static_cast<int>(i);
  return -1;
}

std::vector<int> PipeDreamProfile::topological_order() const {
  const int n = static_cast<int>(nodes.size());
  std::vector<std::vector<int>> successors(n);
  std::vector<int> in_degree(n, 0);
  for (const auto& [from, to] : edges) {
    successors[from].push_back(to);
    ++in_degree[to];
  }
  // Ready nodes ordered by (number in the id, file position).
  using Key = std::pair<long, int>;
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
  for (int i = 0; i < n; ++i)
    if (in_degree[i] == 0) ready.push({id_number(nodes[i].id), i});
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    const int node = ready.top().second;
    ready.pop();
    order.push_back(node);
    for (int next : successors[node])
      if (--in_degree[next] == 0) ready.push({id_number(nodes[next].id), next});
  }
  PARTRAIN_CHECK(static_cast<int>(order.size()) == n,
                 source << ": the PipeDream graph has a cycle (" << n - static_cast<int>(order.size())
                        << " nodes on or after it)");
  return order;
}

PipeDreamProfile parse_pipedream_profile(std::istream& input, const std::string& source_name) {
  PipeDreamProfile profile;
  profile.source = source_name;
  std::unordered_map<std::string, int> index;
  struct PendingEdge {
    std::string from, to;
    int line;
  };
  std::vector<PendingEdge> pending;
  std::string line;
  int number = 0;
  while (std::getline(input, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim(line).empty()) continue;
    if (line.front() == '\t' || line.front() == ' ') {
      const std::vector<std::string> ends = split(trim(line), " -- ");
      PARTRAIN_CHECK(ends.size() == 2 && !trim(ends[0]).empty() && !trim(ends[1]).empty(),
                     source_name << ":" << number << ": an edge line must read '<TAB>nodeA -- nodeB'");
      pending.push_back({trim(ends[0]), trim(ends[1]), number});
      continue;
    }
    std::vector<std::string> parts = split(line, " -- ");
    PARTRAIN_CHECK(parts.size() >= 3, source_name << ":" << number
                                                  << ": a node line must read 'id -- description -- "
                                                     "forward_compute_time=..., ...'");
    PipeDreamNode node;
    node.line = number;
    node.id = trim(parts[0]);
    PARTRAIN_CHECK(!node.id.empty(), source_name << ":" << number << ": empty node id");
    std::size_t figures = parts.size() - 1;
    if (trim(parts.back()).starts_with("stage_id=")) {
      double stage = 0;
      PARTRAIN_CHECK(parse_number(trim(parts.back()).substr(9), stage) && stage >= 0 && stage == static_cast<int>(stage),
                     source_name << ":" << number << ": bad stage_id in '" << trim(parts.back()) << "'");
      node.stage_id = static_cast<int>(stage);
      --figures;
    }
    PARTRAIN_CHECK(figures >= 2, source_name << ":" << number << ": node " << node.id << " has no description");
    for (std::size_t p = 1; p < figures; ++p) node.description += (p > 1 ? " -- " : "") + parts[p];
    node.description = trim(node.description);
    std::map<std::string, std::string> fields;
    for (const std::string& field : split(parts[figures], ",")) {
      const std::size_t equals = field.find('=');
      PARTRAIN_CHECK(equals != std::string::npos, source_name << ":" << number << ": node " << node.id
                                                              << ": expected key=value, got '" << trim(field) << "'");
      fields[trim(field.substr(0, equals))] = field.substr(equals + 1);
    }
    const auto number_field = [&](const char* key, double& value, bool list) {
      auto found = fields.find(key);
      PARTRAIN_CHECK(found != fields.end(), source_name << ":" << number << ": node " << node.id << " has no " << key);
      const bool ok = list ? parse_sum(found->second, value) : parse_number(found->second, value);
      PARTRAIN_CHECK(ok && value >= 0, source_name << ":" << number << ": node " << node.id << ": " << key << " '"
                                                   << trim(found->second) << "' is not a non-negative number");
    };
    number_field("forward_compute_time", node.forward_ms, false);
    number_field("backward_compute_time", node.backward_ms, false);
    number_field("activation_size", node.activation_bytes, true);
    number_field("parameter_size", node.parameter_bytes, false);
    PARTRAIN_CHECK(index.emplace(node.id, static_cast<int>(profile.nodes.size())).second,
                   source_name << ":" << number << ": node " << node.id << " is defined twice");
    profile.nodes.push_back(std::move(node));
  }
  for (const PendingEdge& edge : pending) {
    auto from = index.find(edge.from), to = index.find(edge.to);
    PARTRAIN_CHECK(from != index.end(), source_name << ":" << edge.line << ": edge from unknown node " << edge.from);
    PARTRAIN_CHECK(to != index.end(), source_name << ":" << edge.line << ": edge to unknown node " << edge.to);
    profile.edges.emplace_back(from->second, to->second);
  }
  std::sort(profile.edges.begin(), profile.edges.end());
  profile.edges.erase(std::unique(profile.edges.begin(), profile.edges.end()), profile.edges.end());
  return profile;
}

PipeDreamProfile read_pipedream_profile(const std::string& path) {
  std::ifstream file(path);
  PARTRAIN_CHECK(file.good(), path << ": cannot open the PipeDream profile");
  return parse_pipedream_profile(file, path);
}

Graph layer_chain_graph(const PipeDreamProfile& profile) {
  const std::vector<int> order = profile.topological_order();
  PARTRAIN_CHECK(!order.empty(), profile.source << ": the PipeDream profile has no nodes");
  const int n = static_cast<int>(profile.nodes.size());
  std::vector<std::vector<int>> predecessors(n);
  std::vector<int> out_degree(n, 0);
  for (const auto& [from, to] : profile.edges) {
    predecessors[to].push_back(from);
    ++out_degree[from];
  }
  Graph graph;
  std::string input_name = "__input__";
  while (profile.find(input_name) >= 0) input_name += "_";
  const int input = graph.add_input(input_name, {kBatch, 1});
  std::vector<int> value_of(n, -1), position(n, 0);
  for (int t = 0; t < n; ++t) position[order[t]] = t;
  std::vector<std::int64_t> width_of(n, 1);
  for (int node : order) {
    std::vector<int>& preds = predecessors[node];
    std::sort(preds.begin(), preds.end(), [&](int a, int b) { return position[a] < position[b]; });
    const std::string& name = profile.nodes[node].id;
    if (preds.empty()) {
      value_of[node] = graph.add(OpType::Relu, name, {input});
    } else if (preds.size() == 1) {
      const int from = preds.front();
      if (width_of[from] == 1) {
        value_of[node] = graph.add(OpType::Relu, name, {value_of[from]});
      } else {
        value_of[node] = graph.add(OpType::Slice, name, {value_of[from]},
                                   Attributes{{"axis", std::int64_t{1}}, {"start", std::int64_t{0}},
                                              {"end", std::int64_t{1}}});
      }
    } else {
      std::vector<int> inputs;
      std::int64_t width = 0;
      for (int from : preds) {
        inputs.push_back(value_of[from]);
        width += width_of[from];
      }
      value_of[node] = graph.add(OpType::Concat, name, inputs, Attributes{{"axis", std::int64_t{1}}});
      width_of[node] = width;
    }
  }
  for (int node : order)
    if (out_degree[node] == 0) graph.mark_output(value_of[node]);
  return graph;
}

namespace {

class LayerProfileCostModel final : public CostModel {
 public:
  LayerProfileCostModel(const PipeDreamProfile& profile, const DeviceSpec& device, std::int64_t profiled_batch)
      : device_(device), profiled_batch_(profiled_batch) {
    PARTRAIN_CHECK(profiled_batch > 0, profile.source << ": the profiled batch must be positive, not " << profiled_batch);
    PARTRAIN_CHECK(device.memory_bytes > 0 && device.link_bandwidth > 0 && device.network_bandwidth > 0 &&
                       device.devices_per_node > 0,
                   "layer profile cost model: device memory, bandwidths and devices per node must be positive");
    source_ = profile.source;
    const std::vector<int> order = profile.topological_order();
    const int n = static_cast<int>(order.size());
    std::vector<int> task_of(n);
    for (int t = 0; t < n; ++t) task_of[order[t]] = t;
    nodes_.resize(n);
    successors_.resize(n);
    predecessors_.resize(n);
    for (int t = 0; t < n; ++t) nodes_[t] = profile.nodes[order[t]];
    for (const auto& [from, to] : profile.edges) {
      successors_[task_of[from]].push_back(task_of[to]);
      predecessors_[task_of[to]].push_back(task_of[from]);
    }
    stamp_.assign(n, 0);
  }

  profile::Measurement measure(std::span<const int> tasks, std::int64_t batch) const override {
    PARTRAIN_CHECK(batch > 0, "layer profile cost model: batch must be positive, not " << batch);
    PARTRAIN_CHECK(!tasks.empty(), "layer profile cost model: empty task set");
    const int n = static_cast<int>(nodes_.size());
    std::lock_guard<std::mutex> lock(mutex_);
    if (++mark_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      mark_ = 1;
    }
    std::vector<int> distinct;
    distinct.reserve(tasks.size());
    for (int t : tasks) {
      PARTRAIN_CHECK(t >= 0 && t < n, source_ << ": task " << t << " is not a layer of the profile (" << n << ")");
      if (stamp_[t] != mark_) {
        stamp_[t] = mark_;
        distinct.push_back(t);
      }
    }
    const double scale = static_cast<double>(batch) / static_cast<double>(profiled_batch_);
    profile::Measurement m;
    double largest = 0;
    for (int t : distinct) {
      const PipeDreamNode& node = nodes_[t];
      m.forward_seconds += node.forward_ms * 1e-3 * scale;
      m.backward_seconds += node.backward_ms * 1e-3 * scale;
      m.parameter_bytes += node.parameter_bytes;
      m.activation_bytes += node.activation_bytes * scale;
      largest = std::max(largest, node.activation_bytes * scale);
      if (std::any_of(successors_[t].begin(), successors_[t].end(), [&](int s) { return stamp_[s] != mark_; }))
        m.boundary_output_bytes += node.activation_bytes * scale;
    }
    // Producers outside the set whose output enters it, each counted once.
    std::vector<int> outside;
    for (int t : distinct)
      for (int p : predecessors_[t])
        if (stamp_[p] != mark_) outside.push_back(p);
    std::sort(outside.begin(), outside.end());
    outside.erase(std::unique(outside.begin(), outside.end()), outside.end());
    for (int p : outside) m.boundary_input_bytes += nodes_[p].activation_bytes * scale;
    m.peak_bytes = m.activation_bytes + largest;
    return m;
  }

  double transfer_seconds(double bytes, bool across_nodes) const override {
    if (bytes <= 0) return 0.0;
    return bytes / (across_nodes ? device_.network_bandwidth : device_.link_bandwidth);
  }
  double allreduce_seconds(double bytes, int replicas, bool across_nodes) const override {
    if (replicas <= 1 || bytes <= 0) return 0.0;
    return 2.0 * (replicas - 1) / replicas * bytes / (across_nodes ? device_.network_bandwidth : device_.link_bandwidth);
  }
  std::string description() const override {
    char text[160];
    std::snprintf(text, sizeof text, "PipeDream layer profile %s (profiled batch %lld, %.3g GiB per device)",
                  source_.c_str(), static_cast<long long>(profiled_batch_), device_.memory_bytes / (1ull << 30));
    return text;
  }
  const DeviceSpec& device() const override { return device_; }

 private:
  DeviceSpec device_;
  std::int64_t profiled_batch_;
  std::string source_;
  std::vector<PipeDreamNode> nodes_;              // by task id
  std::vector<std::vector<int>> successors_;      // by task id
  std::vector<std::vector<int>> predecessors_;    // by task id
  mutable std::mutex mutex_;
  mutable std::vector<unsigned> stamp_;
  mutable unsigned mark_ = 0;
};

}  // namespace

std::unique_ptr<CostModel> make_layer_profile_cost_model(const PipeDreamProfile& profile, const DeviceSpec& device,
                                                         std::int64_t profiled_batch) {
  return std::make_unique<LayerProfileCostModel>(profile, device, profiled_batch);
}

}  // namespace partrain::partition
