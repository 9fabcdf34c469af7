#include "partition/tarnawski/ideals_dp.h"

#include <sstream>

#include <algorithm>
#include <cmath>
#include <deque>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "partition/tarnawski/class_simplification.h"
#include "partition/tarnawski/dpl.h"

namespace partrain::partition {
namespace {

bool has_bit(const std::uint64_t* bits, std::size_t index) { return (bits[index >> 6] >> (index & 63)) & 1u; }
void set_bit(std::uint64_t* bits, std::size_t index) { bits[index >> 6] |= std::uint64_t{1} << (index & 63); }

constexpr double infinity = std::numeric_limits<double>::infinity();

// How dp(I, a, c) was reached.
enum class Step : std::uint8_t { none, fewer_accelerators, fewer_cpus, accelerator_block, cpu_block };

struct Choice {
  std::uint32_t previous = 0;
  Step step = Step::none;
};

}  // namespace

ClassGraph::ClassGraph(const Workload& workload, const ClassGraphOptions& options) {
  const std::size_t node_count = workload.nodes.size();
  PARTRAIN_CHECK(node_count > 0, workload.source << ": the workload has no nodes");
  SimplifiedClasses simplified;
  if (options.simplify) {
    simplified = simplify_classes(workload, options.accelerator_memory_bytes, options.contract_trivial);
    class_of_node = simplified.class_of_node;
    class_count = simplified.class_count;
    colour_class_count = simplified.colour_class_count;
    fused_class_count = simplified.fused_classes;
    contracted_class_count = simplified.contracted_classes;
  } else {
    class_of_node = colour_classes(workload, class_count);
    colour_class_count = class_count;
  }
  words = (class_count + 63) / 64;
  members.assign(class_count, {});
  accelerator_latency_ms.assign(class_count, 0.0);
  cpu_latency_ms.assign(class_count, 0.0);
  size_bytes.assign(class_count, 0.0);
  unsupported_count.assign(class_count, 0);
  for (std::size_t node = 0; node < node_count; ++node) {
    const WorkloadNode& entry = workload.nodes[node];
    const std::size_t owner = class_of_node[node];
    members[owner].push_back(node);
    accelerator_latency_ms[owner] += entry.accelerator_latency_ms;
    cpu_latency_ms[owner] += entry.cpu_latency_ms;
    size_bytes[owner] += entry.size_bytes;
    if (!entry.supported_on_accelerator) ++unsupported_count[owner];
  }
  // Forward DAG arcs and the heads of every node.
  predecessor_bits.assign(class_count * words, 0);
  successors.assign(class_count, {});
  std::vector<double> out_cost(node_count, 0.0);
  std::vector<std::vector<std::size_t>> head_classes(node_count);
  for (const WorkloadEdge& edge : workload.edges) {
    const std::size_t from = class_of_node[edge.source];
    const std::size_t to = class_of_node[edge.destination];
    out_cost[edge.source] = std::max(out_cost[edge.source], edge.cost_ms);
    if (from == to) continue;
    head_classes[edge.source].push_back(to);
  }
  // Arcs of the forward DAG.
  std::vector<bool> has_forward(class_count, false);
  for (std::size_t node = 0; node < node_count; ++node)
    if (!workload.nodes[node].backward) has_forward[class_of_node[node]] = true;
  auto reaches = [&](std::size_t start, std::size_t target) {
    std::vector<bool> seen(class_count, false);
    std::vector<std::size_t> pending{start};
    seen[start] = true;
    while (!pending.empty()) {
      const std::size_t c = pending.back();
      pending.pop_back();
      if (c == target) return true;
      for (std::size_t next : successors[c])
        if (!seen[next]) { seen[next] = true; pending.push_back(next); }
    }
    return false;
  };
  auto add_arc = [&](std::size_t from, std::size_t to, bool skip_if_cycle) {
    if (from == to || has_bit(&predecessor_bits[to * words], from)) return;
    if (skip_if_cycle && reaches(to, from)) return;
    set_bit(&predecessor_bits[to * words], from);
    successors[from].push_back(to);
  };
  if (options.simplify) {
    // The DP's form (class_simplification.h): arcs computed there, acyclic.
    for (auto [from, to] : simplified.arcs) add_arc(from, to, false);
  } else {
    // Forward edges between classes that hold forward nodes: the forward DAG of the paper.
    for (const WorkloadEdge& edge : workload.edges)
      if (!workload.nodes[edge.source].backward && !workload.nodes[edge.destination].backward)
        add_arc(class_of_node[edge.source], class_of_node[edge.destination], false);
    // A backward-only class gets a zero-cost forward node, placed by its edges: first the edges
    // from forward nodes (as given), then the edges between backward nodes reversed (the backward
    // pass runs against the forward order); an arc that would close a cycle is left out.
    for (int pass = 0; pass < 2; ++pass)
      for (const WorkloadEdge& edge : workload.edges) {
        const std::size_t from = class_of_node[edge.source];
        const std::size_t to = class_of_node[edge.destination];
        if (has_forward[from] && has_forward[to]) continue;
        const bool source_backward = workload.nodes[edge.source].backward;
        if (pass == 0 && !source_backward) add_arc(from, to, true);
        if (pass == 1 && source_backward) add_arc(to, from, true);
      }
  }
  for (std::size_t node = 0; node < node_count; ++node) {
    std::vector<std::size_t>& heads = head_classes[node];
    if (heads.empty() || out_cost[node] <= 0.0) continue;
    heads.push_back(class_of_node[node]);
    std::sort(heads.begin(), heads.end());
    heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
    communicating_cost_ms.push_back(out_cost[node]);
    communicating_node.push_back(node);
    communicating_classes.push_back(std::move(heads));
  }
  // Kahn's algorithm, FIFO.
  std::vector<std::size_t> in_degree(class_count, 0);
  for (std::size_t from = 0; from < class_count; ++from)
    for (std::size_t to : successors[from]) ++in_degree[to];
  std::deque<std::size_t> ready;
  for (std::size_t c = 0; c < class_count; ++c)
    if (in_degree[c] == 0) ready.push_back(c);
  while (!ready.empty()) {
    const std::size_t c = ready.front();
    ready.pop_front();
    topological_order.push_back(c);
    for (std::size_t to : successors[c])
      if (--in_degree[to] == 0) ready.push_back(to);
  }
  if (topological_order.size() == class_count) {
    // DPL's order: each class as late as possible (Kahn on the reversed DAG, FIFO, then reversed),
    // so that parameters and other sources sit next to their consumers.
    std::vector<std::size_t> out_degree(class_count, 0);
    std::vector<std::vector<std::size_t>> predecessors(class_count);
    for (std::size_t from = 0; from < class_count; ++from)
      for (std::size_t to : successors[from]) { ++out_degree[from]; predecessors[to].push_back(from); }
    std::deque<std::size_t> sinks;
    for (std::size_t c = class_count; c-- > 0;)
      if (out_degree[c] == 0) sinks.push_back(c);
    std::vector<std::size_t> reversed;
    while (!sinks.empty()) {
      const std::size_t c = sinks.front();
      sinks.pop_front();
      reversed.push_back(c);
      for (std::size_t from : predecessors[c])
        if (--out_degree[from] == 0) sinks.push_back(from);
    }
    topological_order.assign(reversed.rbegin(), reversed.rend());
  }
  PARTRAIN_CHECK(topological_order.size() == class_count,
                 workload.source << ": the forward graph of colour classes has a cycle (" << class_count - topological_order.size()
                                 << " classes on or after cycles); colour classes must contract to a DAG");
}

double ClassGraph::communication_ms(const std::uint64_t* set_bits) const {
  double total = 0.0;
  for (std::size_t x = 0; x < communicating_node.size(); ++x) {
    std::size_t inside = 0;
    for (std::size_t c : communicating_classes[x]) inside += has_bit(set_bits, c);
    if (inside > 0 && inside < communicating_classes[x].size()) total += communicating_cost_ms[x];
  }
  return total;
}

IdealFamily enumerate_ideals(const ClassGraph& graph, std::size_t max_ideals, const std::string& source_name) {
  IdealFamily family;
  const std::size_t words = graph.words;
  family.words = words;
  family.bits.assign(words, 0);
  family.lower_neighbours.emplace_back();
  std::unordered_map<std::string_view, std::uint32_t> index_of;
  // Keys point into `keys`, a deque of strings (stable addresses).
  std::deque<std::string> keys;
  auto key_of = [&](const std::uint64_t* bits) {
    return std::string(reinterpret_cast<const char*>(bits), words * sizeof(std::uint64_t));
  };
  keys.push_back(key_of(family.ideal(0)));
  index_of.emplace(keys.back(), 0);
  std::vector<std::uint64_t> candidate(words);
  for (std::size_t current = 0; current < family.size(); ++current) {
    for (std::size_t c = 0; c < graph.class_count; ++c) {
      const std::uint64_t* ideal = family.ideal(current);
      if (has_bit(ideal, c)) continue;
      const std::uint64_t* predecessors = &graph.predecessor_bits[c * words];
      bool addable = true;
      for (std::size_t w = 0; w < words && addable; ++w) addable = (predecessors[w] & ~ideal[w]) == 0;
      if (!addable) continue;
      std::copy(ideal, ideal + words, candidate.begin());
      set_bit(candidate.data(), c);
      std::string key = key_of(candidate.data());
      auto found = index_of.find(std::string_view(key));
      std::uint32_t index;
      if (found == index_of.end()) {
        if (family.size() >= max_ideals) {
          std::ostringstream message;
          message << source_name << ": the forward graph of " << graph.class_count << " colour classes has more than "
                  << max_ideals << " ideals; use the linearised planner (--planner dpl) or raise the ideal cap";
          throw TooManyIdealsError(__FILE__, __LINE__, message.str());
        }
        index = static_cast<std::uint32_t>(family.size());
        family.bits.insert(family.bits.end(), candidate.begin(), candidate.end());
        family.lower_neighbours.emplace_back();
        keys.push_back(std::move(key));
        index_of.emplace(keys.back(), index);
      } else {
        index = found->second;
      }
      family.lower_neighbours[index].push_back(static_cast<std::uint32_t>(current));
    }
  }
  return family;
}

namespace {

// Per-ideal prefix sums over its classes, so that the cost of a block S = I \ I' is a difference,
// and per ideal the communicating nodes whose touched classes it splits: only a node split by I or
// by I' can pay in comm(I \ I').
struct IdealCosts {
  std::vector<double> accelerator_sum, cpu_sum, size_sum;
  std::vector<int> unsupported_sum;
  std::vector<std::uint32_t> split_offsets;  // ideal i's split nodes are split_nodes[offsets[i], offsets[i + 1])
  std::vector<std::uint32_t> split_nodes;
};

IdealCosts ideal_costs(const ClassGraph& graph, const IdealFamily& family) {
  const std::size_t ideal_count = family.size();
  const std::size_t words = family.words;
  IdealCosts costs;
  costs.accelerator_sum.assign(ideal_count, 0.0);
  costs.cpu_sum.assign(ideal_count, 0.0);
  costs.size_sum.assign(ideal_count, 0.0);
  costs.unsupported_sum.assign(ideal_count, 0);
  costs.split_offsets.assign(ideal_count + 1, 0);
  for (std::size_t i = 0; i < ideal_count; ++i) {
    const std::uint64_t* bits = family.ideal(i);
    for (std::size_t w = 0; w < words; ++w) {
      for (std::uint64_t word = bits[w]; word != 0; word &= word - 1) {
        const std::size_t c = w * 64 + static_cast<std::size_t>(__builtin_ctzll(word));
        costs.accelerator_sum[i] += graph.accelerator_latency_ms[c];
        costs.cpu_sum[i] += graph.cpu_latency_ms[c];
        costs.size_sum[i] += graph.size_bytes[c];
        costs.unsupported_sum[i] += graph.unsupported_count[c];
      }
    }
    for (std::size_t x = 0; x < graph.communicating_node.size(); ++x) {
      std::size_t inside = 0;
      for (std::size_t c : graph.communicating_classes[x]) inside += has_bit(bits, c);
      if (inside > 0 && inside < graph.communicating_classes[x].size()) costs.split_nodes.push_back(static_cast<std::uint32_t>(x));
    }
    costs.split_offsets[i + 1] = static_cast<std::uint32_t>(costs.split_nodes.size());
  }
  return costs;
}

// The DP of §5.1.1 on a family of ideals: dp[I][a][c], the smallest max load of a split of the ideal
// I onto a accelerators and c CPUs, filled ideal by ideal (each ideal comes after its lower
// neighbours), then the split of the full ideal read back block by block.
class IdealDp {
 public:
  IdealDp(const ClassGraph& graph, const IdealFamily& family, int accelerators, int cpus, double memory, double upper_bound_ms)
      : graph_(graph),
        family_(family),
        costs_(ideal_costs(graph, family)),
        accelerators_(accelerators),
        cpus_(cpus),
        memory_(memory),
        cpu_states_(static_cast<std::size_t>(cpus) + 1),
        states_((static_cast<std::size_t>(accelerators) + 1) * cpu_states_),
        bound_(std::isfinite(upper_bound_ms) ? upper_bound_ms * (1.0 + 1e-9) + 1e-9 : infinity),
        best_(family.size() * states_, infinity),
        choice_(family.size() * states_) {
    std::fill(best_.begin(), best_.begin() + static_cast<std::ptrdiff_t>(states_), 0.0);  // the empty ideal
  }

  // Fills every ideal's row of the table.
  void fill() {
    std::vector<std::uint32_t> visited(family_.size(), 0);
    std::vector<std::uint32_t> stack;
    for (std::size_t i = 1; i < family_.size(); ++i) {
      fill_row(i, visited, stack);
      allow_empty_devices(i);
    }
  }

  // dp[full ideal][all accelerators][all CPUs] (inf when no split exists).
  double optimum() const { return best_[(family_.size() - 1) * states_ + state(accelerators_, cpus_)]; }

  // The optimum's blocks in pipeline order, with their device indices.
  std::vector<DeviceBlock> stages() const;

 private:
  std::size_t state(int a, int c) const { return static_cast<std::size_t>(a) * cpu_states_ + static_cast<std::size_t>(c); }

  // comm(I \ I') for the ideals outer = I ⊇ inner = I': the incoming and outgoing communication of
  // acc(S) in §5.1.1; only nodes split by I or by I' can pay.
  double communication(std::size_t outer, std::size_t inner) const {
    const std::uint64_t* outer_bits = family_.ideal(outer);
    const std::uint64_t* inner_bits = family_.ideal(inner);
    auto pays = [&](std::size_t x) {
      std::size_t inside = 0;
      for (std::size_t c : graph_.communicating_classes[x]) inside += has_bit(outer_bits, c) && !has_bit(inner_bits, c);
      return inside > 0 && inside < graph_.communicating_classes[x].size();
    };
    auto split_by_outer = [&](std::size_t x) {
      std::size_t inside = 0;
      for (std::size_t c : graph_.communicating_classes[x]) inside += has_bit(outer_bits, c);
      return inside > 0 && inside < graph_.communicating_classes[x].size();
    };
    double total = 0.0;
    for (std::uint32_t position = costs_.split_offsets[outer]; position < costs_.split_offsets[outer + 1]; ++position) {
      const std::size_t x = costs_.split_nodes[position];
      if (pays(x)) total += graph_.communicating_cost_ms[x];
    }
    for (std::uint32_t position = costs_.split_offsets[inner]; position < costs_.split_offsets[inner + 1]; ++position) {
      const std::size_t x = costs_.split_nodes[position];
      if (!split_by_outer(x) && pays(x)) total += graph_.communicating_cost_ms[x];
    }
    return total;
  }

  // The worst cell of ideal i's row other than (0, 0), capped at the bound: a block whose own load
  // reaches it improves no cell.
  double threshold(std::size_t i) const {
    const double* row = &best_[i * states_];
    double worst = 0.0;
    for (std::size_t s = 1; s < states_; ++s) worst = std::max(worst, row[s]);
    return std::min(worst, bound_);
  }

  // The transition of §5.1.1 for the ideal i: the last device holds I \ I' for an ideal I' ⊂ I,
  // visited from i's lower neighbours downwards; a smaller I' only makes the block heavier, so the
  // search stops below an I' whose block is already too heavy for both kinds of device.
  void fill_row(std::size_t i, std::vector<std::uint32_t>& visited, std::vector<std::uint32_t>& stack) {
    double current_threshold = bound_;
    stack.assign(family_.lower_neighbours[i].begin(), family_.lower_neighbours[i].end());
    for (std::uint32_t j : stack) visited[j] = static_cast<std::uint32_t>(i);
    while (!stack.empty()) {
      const std::uint32_t j = stack.back();
      stack.pop_back();
      const double accelerator_compute = costs_.accelerator_sum[i] - costs_.accelerator_sum[j];
      const double cpu_compute = costs_.cpu_sum[i] - costs_.cpu_sum[j];
      const bool accelerator_allowed = accelerators_ > 0 && costs_.unsupported_sum[i] == costs_.unsupported_sum[j] &&
                                       costs_.size_sum[i] - costs_.size_sum[j] <= memory_;
      const bool accelerator_useful = accelerator_allowed && accelerator_compute < current_threshold;
      const bool cpu_useful = cpus_ > 0 && cpu_compute < current_threshold;
      if (!accelerator_useful && !cpu_useful) continue;  // every smaller I' is no better: prune
      bool improved = false;
      if (accelerator_useful) improved |= relax(i, j, accelerator_compute + communication(i, j), Step::accelerator_block);
      if (cpu_useful) improved |= relax(i, j, cpu_compute, Step::cpu_block);
      if (improved) current_threshold = threshold(i);
      for (std::uint32_t lower : family_.lower_neighbours[j]) {
        if (visited[lower] == i) continue;
        visited[lower] = static_cast<std::uint32_t>(i);
        stack.push_back(lower);
      }
    }
  }

  // max(dp[I'][a − 1][c], acc(I \ I')) (accelerator_block) or max(dp[I'][a][c − 1], cpu(I \ I'))
  // (cpu_block) into every cell of ideal i's row it improves; `load` is the block's load. Returns
  // whether a cell improved.
  bool relax(std::size_t i, std::uint32_t j, double load, Step step) {
    double* row = &best_[i * states_];
    Choice* row_choice = &choice_[i * states_];
    const double* previous = &best_[static_cast<std::size_t>(j) * states_];
    const bool accelerator = step == Step::accelerator_block;
    bool improved = false;
    for (int a = accelerator ? 1 : 0; a <= accelerators_; ++a)
      for (int c = accelerator ? 0 : 1; c <= cpus_; ++c) {
        const double candidate = std::max(previous[accelerator ? state(a - 1, c) : state(a, c - 1)], load);
        if (candidate < row[state(a, c)]) {
          row[state(a, c)] = candidate;
          row_choice[state(a, c)] = {j, step};
          improved = true;
        }
      }
    return improved;
  }

  // Devices may stay empty: dp[I][a][c] ≤ dp[I][a − 1][c] and ≤ dp[I][a][c − 1].
  void allow_empty_devices(std::size_t i) {
    double* row = &best_[i * states_];
    Choice* row_choice = &choice_[i * states_];
    for (int a = 0; a <= accelerators_; ++a)
      for (int c = 0; c <= cpus_; ++c) {
        if (a > 0 && row[state(a - 1, c)] < row[state(a, c)]) {
          row[state(a, c)] = row[state(a - 1, c)];
          row_choice[state(a, c)] = {static_cast<std::uint32_t>(i), Step::fewer_accelerators};
        }
        if (c > 0 && row[state(a, c - 1)] < row[state(a, c)]) {
          row[state(a, c)] = row[state(a, c - 1)];
          row_choice[state(a, c)] = {static_cast<std::uint32_t>(i), Step::fewer_cpus};
        }
      }
  }

  // The block I \ I' of the ideals i ⊃ j as a device: its nodes, size and load.
  DeviceBlock block_of(std::size_t i, std::size_t j, bool accelerator, std::vector<std::uint64_t>& block) const {
    DeviceBlock device;
    device.accelerator = accelerator;
    const std::uint64_t* outer = family_.ideal(i);
    const std::uint64_t* inner = family_.ideal(j);
    for (std::size_t w = 0; w < family_.words; ++w) block[w] = outer[w] & ~inner[w];
    for (std::size_t cls = 0; cls < graph_.class_count; ++cls)
      if (has_bit(block.data(), cls)) device.nodes.insert(device.nodes.end(), graph_.members[cls].begin(), graph_.members[cls].end());
    std::sort(device.nodes.begin(), device.nodes.end());
    device.size_bytes = costs_.size_sum[i] - costs_.size_sum[j];
    if (device.accelerator) {
      device.compute_ms = costs_.accelerator_sum[i] - costs_.accelerator_sum[j];
      device.communication_ms = graph_.communication_ms(block.data());
    } else {
      device.compute_ms = costs_.cpu_sum[i] - costs_.cpu_sum[j];
    }
    device.load_ms = device.compute_ms + device.communication_ms;
    return device;
  }

  const ClassGraph& graph_;
  const IdealFamily& family_;
  const IdealCosts costs_;
  const int accelerators_;
  const int cpus_;
  const double memory_;
  const std::size_t cpu_states_;
  const std::size_t states_;  // (a, c) cells per ideal
  const double bound_;        // no cell above it is kept (the caller's upper bound, with a rounding margin)
  std::vector<double> best_;  // [ideal × states + state(a, c)]
  std::vector<Choice> choice_;
};

std::vector<DeviceBlock> IdealDp::stages() const {
  std::vector<DeviceBlock> devices;
  std::size_t i = family_.size() - 1;
  int a = accelerators_, c = cpus_;
  std::vector<std::uint64_t> block(family_.words);
  while (i != 0) {
    const Choice taken = choice_[i * states_ + state(a, c)];
    PARTRAIN_CHECK(taken.step != Step::none, "internal error: broken DP reconstruction");
    if (taken.step == Step::fewer_accelerators) { --a; continue; }
    if (taken.step == Step::fewer_cpus) { --c; continue; }
    const std::size_t j = taken.previous;
    DeviceBlock device = block_of(i, j, taken.step == Step::accelerator_block, block);
    if (device.accelerator) {
      --a;
    } else {
      --c;
    }
    devices.push_back(std::move(device));
    i = j;
  }
  std::reverse(devices.begin(), devices.end());
  int accelerator_index = 0, cpu_index = 0;
  for (DeviceBlock& device : devices) device.device_index = device.accelerator ? accelerator_index++ : cpu_index++;
  return devices;
}

}  // namespace

PartitionResult partition_over_ideals(const Workload& workload, const ClassGraph& graph, const IdealFamily& family,
                                      const PartitionOptions& options, double upper_bound_ms) {
  const int accelerators = options.accelerators >= 0 ? options.accelerators : workload.accelerators;
  const int cpus = options.cpus >= 0 ? options.cpus : workload.cpus;
  const double memory = options.accelerator_memory_bytes >= 0 ? options.accelerator_memory_bytes : workload.accelerator_memory_bytes;
  IdealDp dp(graph, family, accelerators, cpus, memory, upper_bound_ms);
  dp.fill();
  const double optimum = dp.optimum();
  PARTRAIN_CHECK(std::isfinite(optimum),
                 workload.source << ": no feasible split with " << accelerators << " accelerators of "
                                 << static_cast<long long>(memory) << " bytes (" << memory / (1024.0 * 1024.0 * 1024.0) << " GiB) and " << cpus << " CPUs"
                                 << (cpus == 0 ? "; allow CPUs (--cpus) or give more accelerators or memory"
                                               : "; give more accelerators or memory"));
  PartitionResult result;
  result.max_load_ms = optimum;
  result.ideal_count = family.size();
  result.class_count = graph.class_count;
  result.devices = dp.stages();
  return result;
}

ClassGraph dp_class_graph(const Workload& workload, const PartitionOptions& options) {
  // The classes as the paper counts its ideals (class_simplification.h); exact for this memory.
  ClassGraphOptions graph_options;
  graph_options.simplify = true;
  graph_options.accelerator_memory_bytes =
      options.accelerator_memory_bytes >= 0 ? options.accelerator_memory_bytes : workload.accelerator_memory_bytes;
  return ClassGraph(workload, graph_options);
}

PartitionResult partition_ideals(const Workload& workload, const PartitionOptions& options) {
  const ClassGraph graph = dp_class_graph(workload, options);
  const IdealFamily family = enumerate_ideals(graph, options.max_ideals, workload.source);
  double upper_bound = infinity;
  try {
    upper_bound = partition_over_ideals(workload, graph, prefix_ideals(graph, graph.topological_order), options).max_load_ms;
  } catch (const Error&) {
    // DPL found nothing; the full DP decides (and reports infeasibility itself).
  }
  return partition_over_ideals(workload, graph, family, options, upper_bound);
}

}  // namespace partrain::partition
