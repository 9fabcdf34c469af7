#include "partition/tarnawski/placement_evaluation.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <queue>

#include "core/error.h"

namespace partrain::partition {
namespace {

bool has_bit(const std::uint64_t* bits, std::size_t index) { return (bits[index >> 6] >> (index & 63)) & 1u; }
void set_bit(std::uint64_t* bits, std::size_t index) { bits[index >> 6] |= std::uint64_t{1} << (index & 63); }

// Classes reachable from `start` (excluding the start set itself) along `arcs`.
std::vector<char> reached_from(const std::vector<std::vector<std::size_t>>& arcs, const std::vector<std::uint64_t>& start,
                               std::size_t count) {
  std::vector<char> seen(count, 0);
  std::vector<std::size_t> pending;
  for (std::size_t c = 0; c < count; ++c)
    if (has_bit(start.data(), c)) pending.push_back(c);
  while (!pending.empty()) {
    const std::size_t c = pending.back();
    pending.pop_back();
    for (std::size_t next : arcs[c])
      if (!seen[next] && !has_bit(start.data(), next)) {
        seen[next] = 1;
        pending.push_back(next);
      }
  }
  return seen;
}

}  // namespace

bool class_set_contiguous(const ClassGraph& graph, const std::vector<std::uint64_t>& set_bits) {
  std::vector<std::vector<std::size_t>> predecessors(graph.class_count);
  for (std::size_t from = 0; from < graph.class_count; ++from)
    for (std::size_t to : graph.successors[from]) predecessors[to].push_back(from);
  const std::vector<char> after = reached_from(graph.successors, set_bits, graph.class_count);
  const std::vector<char> before = reached_from(predecessors, set_bits, graph.class_count);
  for (std::size_t c = 0; c < graph.class_count; ++c)
    if (after[c] && before[c]) return false;
  return true;
}

std::vector<SubgraphCost> placement_subgraphs(const ClassGraph& graph, const Placement& placement) {
  PARTRAIN_CHECK(placement.device_of_class.size() == graph.class_count,
                 "placement: " << placement.device_of_class.size() << " classes placed, the graph has " << graph.class_count);
  PARTRAIN_CHECK(placement.slot_of_class.empty() || placement.slot_of_class.size() == graph.class_count,
                 "placement: slot_of_class must be empty or list every class");
  std::map<std::pair<int, int>, std::vector<std::size_t>> classes_of;  // (device, slot) -> classes
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    const int device = placement.device_of_class[c];
    const int slot = placement.slot(c);
    PARTRAIN_CHECK(device >= 0 && device < placement.devices() && slot >= 0 && slot < placement.slots,
                   "placement: class " << c << " on device " << device << " slot " << slot << " of "
                                       << placement.devices() << " devices x " << placement.slots << " slots");
    classes_of[{device, slot}].push_back(c);
  }
  std::vector<SubgraphCost> subgraphs;
  for (const auto& [where, classes] : classes_of) {
    SubgraphCost subgraph;
    subgraph.slot = where.second;
    DeviceBlock& block = subgraph.block;
    block.accelerator = placement.is_accelerator(where.first);
    block.device_index = block.accelerator ? where.first : where.first - placement.accelerators;
    std::vector<std::uint64_t> bits(graph.words, 0);
    for (std::size_t c : classes) {
      set_bit(bits.data(), c);
      block.nodes.insert(block.nodes.end(), graph.members[c].begin(), graph.members[c].end());
      block.compute_ms += block.accelerator ? graph.accelerator_latency_ms[c] : graph.cpu_latency_ms[c];
      block.size_bytes += graph.size_bytes[c];
    }
    std::sort(block.nodes.begin(), block.nodes.end());
    if (block.accelerator) block.communication_ms = graph.communication_ms(bits.data());
    block.load_ms = block.compute_ms + block.communication_ms;
    subgraphs.push_back(std::move(subgraph));
  }
  return subgraphs;
}

bool placement_fits(const ClassGraph& graph, const Placement& placement, double memory_bytes) {
  std::vector<double> size(static_cast<std::size_t>(placement.devices()), 0.0);
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    const int device = placement.device_of_class[c];
    if (!placement.is_accelerator(device)) continue;
    if (graph.unsupported_count[c] > 0) return false;
    size[static_cast<std::size_t>(device)] += graph.size_bytes[c];
  }
  for (int device = 0; device < placement.accelerators; ++device)
    if (size[static_cast<std::size_t>(device)] > memory_bytes) return false;
  return true;
}

double placement_max_load(const ClassGraph& graph, const Placement& placement) {
  std::vector<double> load(static_cast<std::size_t>(placement.devices()), 0.0);
  for (const SubgraphCost& subgraph : placement_subgraphs(graph, placement)) {
    const int device = subgraph.block.accelerator ? subgraph.block.device_index
                                                  : subgraph.block.device_index + placement.accelerators;
    load[static_cast<std::size_t>(device)] += subgraph.block.load_ms;
  }
  return load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}

bool placement_contiguous(const ClassGraph& graph, const Placement& placement) {
  std::map<std::pair<int, int>, std::vector<std::uint64_t>> sets;
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    auto [position, inserted] = sets.try_emplace({placement.device_of_class[c], placement.slot(c)});
    if (inserted) position->second.assign(graph.words, 0);
    set_bit(position->second.data(), c);
  }
  for (const auto& [where, bits] : sets)
    if (!class_set_contiguous(graph, bits)) return false;
  return true;
}

double schedule_latency(const Workload& workload, const ClassGraph& graph, const Placement& placement,
                        std::vector<SubgraphCost>& subgraphs) {
  // Subgraph index of every class.
  std::map<std::pair<int, int>, std::size_t> index_of;
  for (std::size_t s = 0; s < subgraphs.size(); ++s) {
    const DeviceBlock& block = subgraphs[s].block;
    const int device = block.accelerator ? block.device_index : block.device_index + placement.accelerators;
    index_of[{device, subgraphs[s].slot}] = s;
  }
  std::vector<std::size_t> subgraph_of_class(graph.class_count);
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    auto found = index_of.find({placement.device_of_class[c], placement.slot(c)});
    PARTRAIN_CHECK(found != index_of.end(), "schedule_latency: subgraphs do not match the placement");
    subgraph_of_class[c] = found->second;
  }
  // Arcs: data dependencies between subgraphs, then the slot order of each device (index_of is
  // sorted by device then slot, so consecutive entries of one device are its slots in order).
  const std::size_t count = subgraphs.size();
  std::vector<std::vector<std::size_t>> successors(count);
  for (const WorkloadEdge& edge : workload.edges) {
    const std::size_t from = subgraph_of_class[graph.class_of_node[edge.source]];
    const std::size_t to = subgraph_of_class[graph.class_of_node[edge.destination]];
    if (from != to) successors[from].push_back(to);
  }
  for (auto it = index_of.begin(); it != index_of.end(); ++it) {
    auto next = std::next(it);
    if (next != index_of.end() && next->first.first == it->first.first) successors[it->second].push_back(next->second);
  }
  std::vector<std::size_t> in_degree(count, 0);
  for (const auto& arcs : successors)
    for (std::size_t to : arcs) ++in_degree[to];
  std::deque<std::size_t> ready;
  for (std::size_t s = 0; s < count; ++s) {
    subgraphs[s].start_ms = 0.0;
    if (in_degree[s] == 0) ready.push_back(s);
  }
  std::size_t done = 0;
  double latency = 0.0;
  while (!ready.empty()) {
    const std::size_t s = ready.front();
    ready.pop_front();
    ++done;
    subgraphs[s].finish_ms = subgraphs[s].start_ms + subgraphs[s].block.load_ms;
    latency = std::max(latency, subgraphs[s].finish_ms);
    for (std::size_t to : successors[s]) {
      subgraphs[to].start_ms = std::max(subgraphs[to].start_ms, subgraphs[s].finish_ms);
      if (--in_degree[to] == 0) ready.push_back(to);
    }
  }
  if (done != count) return std::numeric_limits<double>::infinity();
  return latency;
}

std::vector<DeviceBlock> pipeline_blocks(const ClassGraph& graph, const Placement& placement) {
  Placement single = placement;
  single.slots = 1;
  single.slot_of_class.clear();
  std::vector<SubgraphCost> subgraphs = placement_subgraphs(graph, single);
  const std::size_t count = subgraphs.size();
  // Subgraph of every device (subgraphs are in device order).
  std::vector<int> subgraph_of_device(static_cast<std::size_t>(placement.devices()), -1);
  for (std::size_t s = 0; s < count; ++s) {
    const DeviceBlock& block = subgraphs[s].block;
    subgraph_of_device[static_cast<std::size_t>(block.accelerator ? block.device_index
                                                                  : placement.accelerators + block.device_index)] =
        static_cast<int>(s);
  }
  std::vector<std::vector<std::size_t>> successors(count);
  std::vector<std::size_t> in_degree(count, 0);
  for (std::size_t u = 0; u < graph.class_count; ++u)
    for (std::size_t v : graph.successors[u]) {
      const auto from = static_cast<std::size_t>(subgraph_of_device[static_cast<std::size_t>(placement.device_of_class[u])]);
      const auto to = static_cast<std::size_t>(subgraph_of_device[static_cast<std::size_t>(placement.device_of_class[v])]);
      if (from == to) continue;
      successors[from].push_back(to);
      ++in_degree[to];
    }
  // Kahn's algorithm, smallest device first among the ready ones; what a cycle leaves behind
  // follows in device order.
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t s = 0; s < count; ++s)
    if (in_degree[s] == 0) ready.push(s);
  std::vector<char> taken(count, 0);
  std::vector<DeviceBlock> blocks;
  while (!ready.empty()) {
    const std::size_t s = ready.top();
    ready.pop();
    taken[s] = 1;
    blocks.push_back(subgraphs[s].block);
    for (std::size_t to : successors[s])
      if (--in_degree[to] == 0) ready.push(to);
  }
  for (std::size_t s = 0; s < count; ++s)
    if (!taken[s]) blocks.push_back(subgraphs[s].block);
  return blocks;
}

bool placement_pipeline_ordered(const ClassGraph& graph, const Placement& placement, const std::vector<DeviceBlock>& blocks) {
  std::vector<std::size_t> position(static_cast<std::size_t>(placement.devices()), 0);
  for (std::size_t b = 0; b < blocks.size(); ++b)
    position[static_cast<std::size_t>(blocks[b].accelerator ? blocks[b].device_index
                                                            : placement.accelerators + blocks[b].device_index)] = b;
  for (std::size_t u = 0; u < graph.class_count; ++u)
    for (std::size_t v : graph.successors[u])
      if (position[static_cast<std::size_t>(placement.device_of_class[u])] >
          position[static_cast<std::size_t>(placement.device_of_class[v])])
        return false;
  return true;
}

}  // namespace partrain::partition
