#include "partition/tarnawski/class_simplification.h"

#include <algorithm>
#include <limits>
#include <map>

namespace partrain::partition {
namespace {

constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

void sort_unique(std::vector<std::pair<std::size_t, std::size_t>>& arcs) {
  std::sort(arcs.begin(), arcs.end());
  arcs.erase(std::unique(arcs.begin(), arcs.end()), arcs.end());
}

// Strongly connected components (Tarjan, iterative so that long chains cannot overflow the stack):
// class -> component, components numbered in order of completion.
std::vector<std::size_t> strong_components(std::size_t count, const std::vector<std::pair<std::size_t, std::size_t>>& arcs,
                                           std::size_t& component_count) {
  std::vector<std::vector<std::size_t>> successors(count);
  for (auto [from, to] : arcs) successors[from].push_back(to);
  std::vector<std::size_t> index(count, none), low(count, 0), component(count, none), stack;
  std::vector<bool> on_stack(count, false);
  std::size_t next_index = 0;
  component_count = 0;
  struct Frame {
    std::size_t node;
    std::size_t next_successor;
  };
  std::vector<Frame> frames;
  for (std::size_t root = 0; root < count; ++root) {
    if (index[root] != none) continue;
    frames.push_back({root, 0});
    index[root] = low[root] = next_index++;
    stack.push_back(root);
    on_stack[root] = true;
    while (!frames.empty()) {
      Frame& frame = frames.back();
      const std::size_t v = frame.node;
      if (frame.next_successor < successors[v].size()) {
        const std::size_t w = successors[v][frame.next_successor++];
        if (index[w] == none) {
          index[w] = low[w] = next_index++;
          stack.push_back(w);
          on_stack[w] = true;
          frames.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        for (;;) {
          const std::size_t w = stack.back();
          stack.pop_back();
          on_stack[w] = false;
          component[w] = component_count;
          if (w == v) break;
        }
        ++component_count;
      }
      frames.pop_back();
      if (!frames.empty()) low[frames.back().node] = std::min(low[frames.back().node], low[v]);
    }
  }
  return component;
}

// Renumbers classes 0.. by first appearance in node order; maps `arcs` along.
void renumber(SimplifiedClasses& result, std::size_t old_count) {
  std::vector<std::size_t> fresh(old_count, none);
  std::size_t count = 0;
  for (std::size_t& c : result.class_of_node) {
    if (fresh[c] == none) fresh[c] = count++;
    c = fresh[c];
  }
  for (auto& [from, to] : result.arcs) {
    from = fresh[from];
    to = fresh[to];
  }
  result.class_count = count;
  sort_unique(result.arcs);
}

}  // namespace

std::vector<std::size_t> colour_classes(const Workload& workload, std::size_t& class_count) {
  std::map<long, std::size_t> class_of_color;
  std::vector<std::size_t> class_of_node(workload.nodes.size());
  class_count = 0;
  for (std::size_t node = 0; node < workload.nodes.size(); ++node) {
    const WorkloadNode& entry = workload.nodes[node];
    if (entry.has_color_class) {
      auto [position, inserted] = class_of_color.emplace(entry.color_class, class_count);
      if (inserted) ++class_count;
      class_of_node[node] = position->second;
    } else {
      class_of_node[node] = class_count++;
    }
  }
  return class_of_node;
}

SimplifiedClasses simplify_classes(const Workload& workload, double accelerator_memory_bytes, bool contract_trivial) {
  SimplifiedClasses result;
  std::size_t count = 0;
  result.class_of_node = colour_classes(workload, count);
  result.colour_class_count = count;
  std::vector<std::size_t>& class_of_node = result.class_of_node;

  // Step 2: forward arcs, and mirrored backward edges for classes without a forward node.
  std::vector<bool> has_forward(count, false);
  for (std::size_t node = 0; node < workload.nodes.size(); ++node)
    if (!workload.nodes[node].backward) has_forward[class_of_node[node]] = true;
  for (const WorkloadEdge& edge : workload.edges) {
    const std::size_t from = class_of_node[edge.source];
    const std::size_t to = class_of_node[edge.destination];
    if (from == to) continue;
    const bool source_backward = workload.nodes[edge.source].backward;
    const bool destination_backward = workload.nodes[edge.destination].backward;
    if (!source_backward && !destination_backward) {
      result.arcs.emplace_back(from, to);
    } else if (source_backward && destination_backward && (!has_forward[from] || !has_forward[to])) {
      result.arcs.emplace_back(to, from);
    }
  }
  sort_unique(result.arcs);

  // Step 3: fuse cycles.
  std::size_t component_count = 0;
  const std::vector<std::size_t> component = strong_components(count, result.arcs, component_count);
  result.fused_classes = count - component_count;
  for (std::size_t& c : class_of_node) c = component[c];
  std::vector<std::pair<std::size_t, std::size_t>> fused_arcs;
  for (auto [from, to] : result.arcs)
    if (component[from] != component[to]) fused_arcs.emplace_back(component[from], component[to]);
  result.arcs = std::move(fused_arcs);
  renumber(result, component_count);
  count = result.class_count;

  // Step 4: contract trivial classes, in passes (a class that absorbed one, or joined one, waits for
  // the next pass, whose neighbourhoods are recomputed), until nothing changes.
  double total_size = 0.0;
  for (const WorkloadNode& entry : workload.nodes) total_size += entry.size_bytes;
  const bool sizes_never_bind = total_size <= accelerator_memory_bytes;
  while (contract_trivial) {
    std::vector<bool> zero_latency(count, true);
    std::vector<double> size(count, 0.0);
    std::vector<int> unsupported(count, 0);
    for (std::size_t node = 0; node < workload.nodes.size(); ++node) {
      const WorkloadNode& entry = workload.nodes[node];
      const std::size_t c = class_of_node[node];
      if (entry.accelerator_latency_ms != 0.0 || entry.cpu_latency_ms != 0.0) zero_latency[c] = false;
      size[c] += entry.size_bytes;
      if (!entry.supported_on_accelerator) ++unsupported[c];
    }
    // The only neighbour of each class (through arcs or edges), `none` when it has none, and
    // whether it has more than one.
    std::vector<std::size_t> neighbour(count, none);
    std::vector<bool> several(count, false), has_arc(count, false);
    auto meet = [&](std::size_t c, std::size_t other) {
      if (neighbour[c] == none) neighbour[c] = other;
      else if (neighbour[c] != other) several[c] = true;
    };
    for (auto [from, to] : result.arcs) {
      meet(from, to);
      meet(to, from);
      has_arc[from] = has_arc[to] = true;
    }
    for (const WorkloadEdge& edge : workload.edges) {
      const std::size_t from = class_of_node[edge.source];
      const std::size_t to = class_of_node[edge.destination];
      if (from == to) continue;
      meet(from, to);
      meet(to, from);
    }
    std::vector<std::size_t> target(count, none);
    std::vector<bool> touched(count, false);
    std::size_t merged = 0;
    for (std::size_t c = 0; c < count; ++c) {
      // Like the released code, only a class with an arc (a forward neighbour) is contracted.
      if (!zero_latency[c] || several[c] || !has_arc[c] || touched[c]) continue;
      const std::size_t m = neighbour[c];
      if (touched[m]) continue;
      if (size[c] > 0.0 && !sizes_never_bind) continue;
      if (unsupported[c] > 0 && unsupported[m] == 0) continue;
      target[c] = m;
      touched[c] = touched[m] = true;
      ++merged;
    }
    if (merged == 0) break;
    result.contracted_classes += merged;
    for (std::size_t& c : class_of_node)
      if (target[c] != none) c = target[c];
    std::vector<std::pair<std::size_t, std::size_t>> kept;
    for (auto [from, to] : result.arcs) {
      const std::size_t a = target[from] != none ? target[from] : from;
      const std::size_t b = target[to] != none ? target[to] : to;
      if (a != b) kept.emplace_back(a, b);
    }
    result.arcs = std::move(kept);
    renumber(result, count);
    count = result.class_count;
  }
  return result;
}

}  // namespace partrain::partition
