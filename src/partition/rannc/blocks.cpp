#include "partition/rannc/blocks.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <utility>

#include "core/error.h"

namespace partrain::partition {

namespace {

// node -> multiplicity (task-level edges, or components holding a constant task). Group degrees
// are small, so a flat vector with linear search beats a hash map.
class Counts {
 public:
  void add(int key, int delta) {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first != key) continue;
      entries_[i].second += delta;
      if (entries_[i].second == 0) {
        entries_[i] = entries_.back();
        entries_.pop_back();
      }
      return;
    }
    PARTRAIN_CHECK(delta > 0, "internal: removing " << -delta << " from absent key " << key);
    entries_.push_back({key, delta});
  }
  int count(int key) const {
    for (const auto& [k, n] : entries_)
      if (k == key) return n;
    return 0;
  }
  const std::vector<std::pair<int, int>>& entries() const { return entries_; }
  std::size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<int, int>> entries_;
};

// A set of atomic components, a node of the quotient graph.
struct Group {
  bool alive = true;
  int members = 0;            // atomic components
  int merged_at_level = -1;   // coarsening level of its last merge (a group merges once per level)
  double own_seconds = 0;     // non-constant tasks (s)
  double own_bytes = 0;       // non-constant tasks (bytes)
  double seconds = 0;         // plus each distinct constant clone once (s)
  double bytes = 0;           // plus each distinct constant clone once (bytes)
  Counts constants;           // constant task -> number of member components holding it
  Counts successors;          // group -> task-level edges into it
  Counts predecessors;        // group -> task-level edges from it
};

class BlockPartitioner {
 public:
  BlockPartitioner(const Graph& graph, const std::vector<AtomicComponent>& components, const BlockOptions& options);
  BlockPartition run();

 private:
  // ---- quotient graph ----
  void add_edge(int from, int to, int delta);
  std::pair<double, double> merged_cost(int a, int b) const;
  bool has_indirect_path(int source, int target);
  void contract(int source, int target);
  bool restore_order(const std::vector<int>& sources, const std::vector<int>& targets);
  // ---- phases ----
  void coarsen(BlockPartition& result);
  void uncoarsen(BlockPartition& result);
  bool try_move(const std::vector<int>& unit);
  std::vector<Block> compact();
  // ---- costs ----
  double grouping_bytes() const;
  int group_of_task(int task, int unit_group) const;
  double cut_bytes(int value, int unit_group);
  std::pair<double, double> greedy_split(const std::vector<int>& sequence, double bound, std::vector<std::size_t>* cuts);

  const Graph& graph_;
  const std::vector<AtomicComponent>& components_;
  const BlockOptions& options_;
  int task_count_ = 0;
  std::vector<int> component_of_task_;     // non-constant task -> component index, -1 for constant tasks
  std::vector<double> value_bytes_;        // bytes of values produced by non-constant tasks, else 0
  std::vector<Group> groups_;              // group ids are the component index it started from
  std::vector<int> group_of_component_;
  std::vector<std::vector<int>> members_;  // coarsening only (uncoarsening keeps Group::members)
  std::vector<int> slot_;                  // group -> position in the quotient graph's topological order
  std::vector<int> group_at_slot_;         // position -> group, -1 where a merged group left a hole
  std::vector<std::vector<int>> levels_;   // levels_[l][component] = group after coarsening level l
  // scratch
  std::vector<int> group_mark_, component_mark_, value_mark_, task_mark_;
  int group_epoch_ = 0, component_epoch_ = 0, value_epoch_ = 0, task_epoch_ = 0;
  std::vector<int> stack_;
};

BlockPartitioner::BlockPartitioner(const Graph& graph, const std::vector<AtomicComponent>& components,
                                   const BlockOptions& options)
    : graph_(graph), components_(components), options_(options) {
  task_count_ = static_cast<int>(graph.tasks().size());
  PARTRAIN_CHECK(options.blocks >= 1, "block partitioning needs blocks >= 1, got " << options.blocks);
  PARTRAIN_CHECK(options.task_seconds.size() == graph.tasks().size(),
                 "task_seconds has " << options.task_seconds.size() << " entries for " << task_count_ << " tasks");
  PARTRAIN_CHECK(options.task_memory_bytes.size() == graph.tasks().size(),
                 "task_memory_bytes has " << options.task_memory_bytes.size() << " entries for " << task_count_
                                          << " tasks");
  PARTRAIN_CHECK(options.bandwidth_bytes_per_second > 0,
                 "bandwidth must be positive, got " << options.bandwidth_bytes_per_second << " B/s");
  PARTRAIN_CHECK(options.batch >= 1, "batch must be >= 1, got " << options.batch);
  PARTRAIN_CHECK(options.merge_ceiling_sigmas >= 0,
                 "merge_ceiling_sigmas must be >= 0, got " << options.merge_ceiling_sigmas);

  const int component_count = static_cast<int>(components.size());
  component_of_task_.assign(task_count_, -1);
  for (int c = 0; c < component_count; ++c) {
    const int task = components[c].task;
    PARTRAIN_CHECK(task >= 0 && task < task_count_, "atomic component " << c << " has unknown task " << task);
    PARTRAIN_CHECK(!graph.task(task).constant,
                   "atomic component " << c << " is built around constant task '" << graph.task(task).name << "'");
    PARTRAIN_CHECK(component_of_task_[task] < 0,
                   "task '" << graph.task(task).name << "' heads two atomic components");
    component_of_task_[task] = c;
  }
  for (const Task& task : graph.tasks())
    PARTRAIN_CHECK(task.constant || component_of_task_[task.id] >= 0,
                   "non-constant task '" << task.name << "' is in no atomic component");

  value_bytes_.assign(graph.values().size(), 0.0);
  for (const Task& task : graph.tasks())
    if (!task.constant)
      for (int output : task.outputs) value_bytes_[output] = activation_bytes(graph, output, options.batch);

  // One group per component; a component that alone exceeds the limit makes the request infeasible.
  groups_.resize(component_count);
  members_.resize(component_count);
  group_of_component_.resize(component_count);
  int largest = -1;
  for (int c = 0; c < component_count; ++c) {
    Group& group = groups_[c];
    const int head = components[c].task;
    group.members = 1;
    group.own_seconds = options.task_seconds[head];
    group.own_bytes = options.task_memory_bytes[head];
    group.seconds = group.own_seconds;
    group.bytes = group.own_bytes;
    bool has_head = false;
    for (int task : components[c].tasks) {
      PARTRAIN_CHECK(task >= 0 && task < task_count_, "atomic component " << c << " lists unknown task " << task);
      if (task == head) {
        has_head = true;
        continue;
      }
      PARTRAIN_CHECK(graph.task(task).constant, "atomic component of '" << graph.task(head).name
                                                                        << "' holds a second non-constant task '"
                                                                        << graph.task(task).name << "'");
      PARTRAIN_CHECK(group.constants.count(task) == 0, "atomic component of '" << graph.task(head).name
                                                                               << "' lists task " << task << " twice");
      group.constants.add(task, 1);
      group.seconds += options.task_seconds[task];
      group.bytes += options.task_memory_bytes[task];
    }
    PARTRAIN_CHECK(has_head, "atomic component of '" << graph.task(head).name << "' does not list its own task");
    members_[c] = {c};
    group_of_component_[c] = c;
    if (largest < 0 || group.bytes > groups_[largest].bytes) largest = c;
  }
  if (largest >= 0) {
    PARTRAIN_CHECK(groups_[largest].bytes <= options.memory_limit_bytes,
                   "atomic component of task '" << graph.task(components[largest].task).name << "' needs "
                                                << groups_[largest].bytes << " bytes, more than the memory limit of "
                                                << options.memory_limit_bytes
                                                << " bytes; the smallest limit that can work is "
                                                << groups_[largest].bytes << " bytes");
  }

  // Edges of the quotient graph: one per use of a non-constant task's output by another component.
  for (int c = 0; c < component_count; ++c) {
    for (int input : graph.task(components[c].task).inputs) {
      const int producer = graph.value(input).producer;
      if (producer >= 0 && !graph.task(producer).constant) add_edge(component_of_task_[producer], c, 1);
    }
  }

  // Task ids are topological, so components by head task are a topological order of the groups.
  group_at_slot_.resize(component_count);
  for (int c = 0; c < component_count; ++c) group_at_slot_[c] = c;
  std::sort(group_at_slot_.begin(), group_at_slot_.end(),
            [&](int a, int b) { return components[a].task < components[b].task; });
  slot_.resize(component_count);
  for (int s = 0; s < component_count; ++s) slot_[group_at_slot_[s]] = s;

  group_mark_.assign(component_count, 0);
  component_mark_.assign(component_count, 0);
  value_mark_.assign(graph.values().size(), 0);
  task_mark_.assign(task_count_, 0);
}

void BlockPartitioner::add_edge(int from, int to, int delta) {
  if (from == to) return;  // inside one group
  groups_[from].successors.add(to, delta);
  groups_[to].predecessors.add(from, delta);
}

// Compute time and memory of the union of two groups: shared constant clones count once.
std::pair<double, double> BlockPartitioner::merged_cost(int a, int b) const {
  const Group& x = groups_[a];
  const Group& y = groups_[b];
  double seconds = x.seconds + y.seconds, bytes = x.bytes + y.bytes;
  const Group& fewer = x.constants.size() <= y.constants.size() ? x : y;
  const Group& more = &fewer == &x ? y : x;
  for (const auto& [task, count] : fewer.constants.entries()) {
    if (more.constants.count(task) == 0) continue;
    seconds -= options_.task_seconds[task];
    bytes -= options_.task_memory_bytes[task];
  }
  return {seconds, bytes};
}

// True when a path source -> ... -> target of two or more edges exists, i.e. merging the edge
// source -> target would make the group non-convex (and the quotient graph cyclic). Only groups
// between the two in the topological order can lie on such a path.
bool BlockPartitioner::has_indirect_path(int source, int target) {
  const int bound = slot_[target];
  const int epoch = ++group_epoch_;
  stack_.clear();
  for (const auto& [next, count] : groups_[source].successors.entries()) {
    if (next == target || slot_[next] >= bound) continue;
    group_mark_[next] = epoch;
    stack_.push_back(next);
  }
  while (!stack_.empty()) {
    const int group = stack_.back();
    stack_.pop_back();
    for (const auto& [next, count] : groups_[group].successors.entries()) {
      if (next == target) return true;
      if (slot_[next] >= bound || group_mark_[next] == epoch) continue;
      group_mark_[next] = epoch;
      stack_.push_back(next);
    }
  }
  return false;
}

// Merges group `target` into `source` (edge source -> target, no indirect path). The merged group
// keeps the source's id and position; the target's predecessors placed after that position are
// then reordered.
void BlockPartitioner::contract(int source, int target) {
  Group& into = groups_[source];
  Group& from = groups_[target];
  const auto [seconds, bytes] = merged_cost(source, target);
  into.seconds = seconds;
  into.bytes = bytes;
  into.own_seconds += from.own_seconds;
  into.own_bytes += from.own_bytes;
  into.members += from.members;
  for (const auto& [task, count] : from.constants.entries()) into.constants.add(task, count);

  const std::vector<std::pair<int, int>> successors = from.successors.entries();
  const std::vector<std::pair<int, int>> predecessors = from.predecessors.entries();
  std::vector<int> late_predecessors;
  for (const auto& [next, count] : successors) {
    groups_[next].predecessors.add(target, -count);
    add_edge(source, next, count);
  }
  for (const auto& [previous, count] : predecessors) {
    groups_[previous].successors.add(target, -count);
    if (previous == source) continue;
    add_edge(previous, source, count);
    if (slot_[previous] > slot_[source]) late_predecessors.push_back(previous);
  }
  from = Group{};
  from.alive = false;
  group_at_slot_[slot_[target]] = -1;

  for (int component : members_[target]) group_of_component_[component] = source;
  members_[source].insert(members_[source].end(), members_[target].begin(), members_[target].end());
  members_[target].clear();

  if (!late_predecessors.empty()) {
    const bool ordered = restore_order(late_predecessors, {source});
    PARTRAIN_CHECK(ordered, "internal: merging a convex pair made the quotient graph cyclic");
  }
}

// Pearce–Kelly repair of the topological order after edges were added from `sources` to
// `targets` that point backwards in it. All the new edges share one endpoint (one source or one
// target), so a cycle exists exactly when a target reaches a source. Returns false (order left
// unchanged) on a cycle. Only groups between the lowest target and the highest source move.
bool BlockPartitioner::restore_order(const std::vector<int>& sources, const std::vector<int>& targets) {
  int lower = slot_[targets.front()], upper = slot_[sources.front()];
  for (int t : targets) lower = std::min(lower, slot_[t]);
  for (int s : sources) upper = std::max(upper, slot_[s]);
  const int source_epoch = ++group_epoch_;
  for (int s : sources) group_mark_[s] = source_epoch;

  // Forward from the targets, within the affected range.
  const int forward_epoch = ++group_epoch_;
  std::vector<int> forward;
  stack_.clear();
  for (int t : targets) {
    if (group_mark_[t] == source_epoch) return false;
    if (group_mark_[t] == forward_epoch) continue;
    group_mark_[t] = forward_epoch;
    stack_.push_back(t);
  }
  while (!stack_.empty()) {
    const int group = stack_.back();
    stack_.pop_back();
    forward.push_back(group);
    for (const auto& [next, count] : groups_[group].successors.entries()) {
      if (slot_[next] > upper || group_mark_[next] == forward_epoch) continue;
      if (group_mark_[next] == source_epoch) return false;
      group_mark_[next] = forward_epoch;
      stack_.push_back(next);
    }
  }
  // Backward from the sources, within the affected range.
  const int backward_epoch = ++group_epoch_;
  std::vector<int> backward;
  for (int s : sources) {
    if (group_mark_[s] == backward_epoch) continue;
    group_mark_[s] = backward_epoch;
    stack_.push_back(s);
  }
  while (!stack_.empty()) {
    const int group = stack_.back();
    stack_.pop_back();
    backward.push_back(group);
    for (const auto& [previous, count] : groups_[group].predecessors.entries()) {
      if (slot_[previous] < lower || group_mark_[previous] == backward_epoch) continue;
      group_mark_[previous] = backward_epoch;
      stack_.push_back(previous);
    }
  }
  // The backward set goes first, then the forward set, each in its old relative order, into the
  // positions they held.
  auto by_slot = [&](int a, int b) { return slot_[a] < slot_[b]; };
  std::sort(backward.begin(), backward.end(), by_slot);
  std::sort(forward.begin(), forward.end(), by_slot);
  std::vector<int> positions;
  positions.reserve(backward.size() + forward.size());
  for (int g : backward) positions.push_back(slot_[g]);
  for (int g : forward) positions.push_back(slot_[g]);
  std::sort(positions.begin(), positions.end());
  std::size_t next = 0;
  for (int g : backward) slot_[g] = positions[next++];
  for (int g : forward) slot_[g] = positions[next++];
  for (int g : backward) group_at_slot_[slot_[g]] = g;
  for (int g : forward) group_at_slot_[slot_[g]] = g;
  return true;
}

// ---------------------------------------------------------------- coarsening (§III-B)

void BlockPartitioner::coarsen(BlockPartition& result) {
  const int k = options_.blocks;
  int live = static_cast<int>(groups_.size());
  struct Candidate {
    int partner, source, target;
    double seconds, bytes;
  };
  std::vector<int> order;
  std::vector<Candidate> candidates;
  for (int level = 1; live > k; ++level) {
    order.clear();
    for (int g = 0; g < static_cast<int>(groups_.size()); ++g)
      if (groups_[g].alive) order.push_back(g);
    // Lightest first, ties in pipeline order, so results do not depend on hashing or ids.
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      if (groups_[a].seconds != groups_[b].seconds) return groups_[a].seconds < groups_[b].seconds;
      return slot_[a] < slot_[b];
    });
    // RaNNC's guard against oversized groups: no merge above mean + s standard deviations.
    double mean = 0, variance = 0;
    for (int g : order) mean += groups_[g].seconds;
    mean /= static_cast<double>(order.size());
    for (int g : order) variance += (groups_[g].seconds - mean) * (groups_[g].seconds - mean);
    const double spread = std::sqrt(variance / static_cast<double>(order.size()));
    const double ceiling = options_.merge_ceiling_sigmas == std::numeric_limits<double>::infinity()
                               ? std::numeric_limits<double>::infinity()
                               : mean + options_.merge_ceiling_sigmas * spread;
    int merges = 0;
    for (int group : order) {
      if (live <= k) break;
      if (!groups_[group].alive || groups_[group].merged_at_level == level) continue;
      candidates.clear();
      for (const auto& [next, count] : groups_[group].successors.entries())
        if (groups_[next].merged_at_level != level) candidates.push_back({next, group, next, 0, 0});
      for (const auto& [previous, count] : groups_[group].predecessors.entries())
        if (groups_[previous].merged_at_level != level) candidates.push_back({previous, previous, group, 0, 0});
      for (Candidate& candidate : candidates)
        std::tie(candidate.seconds, candidate.bytes) = merged_cost(candidate.source, candidate.target);
      std::sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
        if (a.seconds != b.seconds) return a.seconds < b.seconds;
        return slot_[a.partner] < slot_[b.partner];
      });
      for (const Candidate& candidate : candidates) {
        if (candidate.bytes > options_.memory_limit_bytes) continue;
        if (candidate.seconds > ceiling) continue;
        if (has_indirect_path(candidate.source, candidate.target)) continue;
        contract(candidate.source, candidate.target);
        groups_[candidate.source].merged_at_level = level;
        --live;
        ++merges;
        break;
      }
    }
    if (merges == 0) break;
    levels_.push_back(group_of_component_);
  }
  result.coarsening_levels = static_cast<int>(levels_.size()) - 1;
  result.coarsened_groups = static_cast<std::size_t>(live);
}

// ---------------------------------------------------------------- uncoarsening (§III-B)

// The coarse group of a non-constant task, with the unit being moved (marked components) placed
// in `unit_group`.
int BlockPartitioner::group_of_task(int task, int unit_group) const {
  const int component = component_of_task_[task];
  return component_mark_[component] == component_epoch_ ? unit_group : group_of_component_[component];
}

// Bytes a value sends across group boundaries with the marked unit placed in `unit_group`.
double BlockPartitioner::cut_bytes(int value, int unit_group) {
  const Value& v = graph_.value(value);
  const int home = group_of_task(v.producer, unit_group);
  int receivers = 0;
  stack_.clear();  // distinct receiving groups
  for (int consumer : v.consumers) {
    const int group = group_of_task(consumer, unit_group);
    if (group == home || std::find(stack_.begin(), stack_.end(), group) != stack_.end()) continue;
    stack_.push_back(group);
    ++receivers;
  }
  return value_bytes_[value] * receivers;
}

double BlockPartitioner::grouping_bytes() const {
  double total = 0;
  for (const Task& task : graph_.tasks()) {
    if (task.constant) continue;
    const int home = group_of_component_[component_of_task_[task.id]];
    for (int output : task.outputs) {
      std::vector<int> receivers;
      for (int consumer : graph_.value(output).consumers) {
        const int group = group_of_component_[component_of_task_[consumer]];
        if (group != home && std::find(receivers.begin(), receivers.end(), group) == receivers.end())
          receivers.push_back(group);
      }
      total += value_bytes_[output] * static_cast<double>(receivers.size());
    }
  }
  return total;
}

// Moves `unit` (components of one finer-level group) to the adjacent coarse group that lowers the
// communication most, if any move keeps the coarse groups convex and within memory.
bool BlockPartitioner::try_move(const std::vector<int>& unit) {
  const int home = group_of_component_[unit.front()];
  if (groups_[home].members == static_cast<int>(unit.size())) return false;  // would empty its group
  const int epoch = ++component_epoch_;
  for (int c : unit) component_mark_[c] = epoch;

  // Neighbouring coarse groups and the values whose cut can change.
  std::vector<int> neighbours, values;
  const int value_epoch = ++value_epoch_;
  auto note_value = [&](int value) {
    if (value_bytes_[value] <= 0 || value_mark_[value] == value_epoch) return;
    value_mark_[value] = value_epoch;
    values.push_back(value);
  };
  auto note_task = [&](int task) {
    const int component = component_of_task_[task];
    if (component_mark_[component] == epoch) return;
    const int group = group_of_component_[component];
    if (group != home && std::find(neighbours.begin(), neighbours.end(), group) == neighbours.end())
      neighbours.push_back(group);
  };
  for (int c : unit) {
    const Task& task = graph_.task(components_[c].task);
    for (int input : task.inputs) {
      const int producer = graph_.value(input).producer;
      if (producer < 0 || graph_.task(producer).constant) continue;
      note_task(producer);
      note_value(input);
    }
    for (int output : task.outputs) {
      for (int consumer : graph_.value(output).consumers) note_task(consumer);
      note_value(output);
    }
  }
  if (neighbours.empty()) return false;  // not at the boundary of its group

  double before = 0;
  for (int value : values) before += cut_bytes(value, home);
  struct Move {
    int group;
    double saved_bytes;
  };
  std::vector<Move> moves;
  for (int group : neighbours) {
    double after = 0;
    for (int value : values) after += cut_bytes(value, group);
    if (after < before) moves.push_back({group, before - after});
  }
  if (moves.empty()) return false;
  std::sort(moves.begin(), moves.end(), [&](const Move& a, const Move& b) {
    if (a.saved_bytes != b.saved_bytes) return a.saved_bytes > b.saved_bytes;
    return slot_[a.group] < slot_[b.group];
  });

  // The unit's own cost and its distinct constant clones.
  double own_seconds = 0, own_bytes = 0;
  Counts constants;
  for (int c : unit) {
    own_seconds += options_.task_seconds[components_[c].task];
    own_bytes += options_.task_memory_bytes[components_[c].task];
    for (int task : components_[c].tasks)
      if (task != components_[c].task) constants.add(task, 1);
  }

  // Re-points the unit's task-level edges from group `from` to group `to`.
  auto shift_edges = [&](int from, int to) {
    for (int c : unit) {
      const Task& task = graph_.task(components_[c].task);
      for (int input : task.inputs) {
        const int producer = graph_.value(input).producer;
        if (producer < 0 || graph_.task(producer).constant) continue;
        const int component = component_of_task_[producer];
        if (component_mark_[component] == epoch) continue;
        const int group = group_of_component_[component];
        add_edge(group, from, -1);
        add_edge(group, to, 1);
      }
      for (int output : task.outputs) {
        for (int consumer : graph_.value(output).consumers) {
          const int component = component_of_task_[consumer];
          if (component_mark_[component] == epoch) continue;
          const int group = group_of_component_[component];
          add_edge(from, group, -1);
          add_edge(to, group, 1);
        }
      }
    }
  };

  for (const Move& move : moves) {
    Group& target = groups_[move.group];
    double bytes = target.bytes + own_bytes;
    for (const auto& [task, count] : constants.entries())
      if (target.constants.count(task) == 0) bytes += options_.task_memory_bytes[task];
    if (bytes > options_.memory_limit_bytes) continue;

    shift_edges(home, move.group);
    // Edges that now point backwards in the order all touch the target group; they all leave it
    // (target after home) or all enter it (target before home).
    std::vector<int> later, earlier;
    for (const auto& [next, count] : target.successors.entries())
      if (slot_[next] < slot_[move.group]) later.push_back(next);
    for (const auto& [previous, count] : target.predecessors.entries())
      if (slot_[previous] > slot_[move.group]) earlier.push_back(previous);
    bool acyclic = true;
    if (!later.empty() && !earlier.empty()) acyclic = false;  // cannot happen; refuse rather than guess
    else if (!later.empty()) acyclic = restore_order({move.group}, later);
    else if (!earlier.empty()) acyclic = restore_order(earlier, {move.group});
    if (!acyclic) {
      shift_edges(move.group, home);
      continue;
    }

    Group& source = groups_[home];
    source.members -= static_cast<int>(unit.size());
    target.members += static_cast<int>(unit.size());
    source.own_seconds -= own_seconds;
    source.own_bytes -= own_bytes;
    source.seconds -= own_seconds;
    source.bytes -= own_bytes;
    target.own_seconds += own_seconds;
    target.own_bytes += own_bytes;
    target.seconds += own_seconds;
    target.bytes += own_bytes;
    for (const auto& [task, count] : constants.entries()) {
      source.constants.add(task, -count);
      if (source.constants.count(task) == 0) {
        source.seconds -= options_.task_seconds[task];
        source.bytes -= options_.task_memory_bytes[task];
      }
      if (target.constants.count(task) == 0) {
        target.seconds += options_.task_seconds[task];
        target.bytes += options_.task_memory_bytes[task];
      }
      target.constants.add(task, count);
    }
    for (int c : unit) group_of_component_[c] = move.group;
    return true;
  }
  return false;
}

void BlockPartitioner::uncoarsen(BlockPartition& result) {
  const int component_count = static_cast<int>(components_.size());
  std::vector<int> unit_index(component_count);
  std::vector<int> by_head(component_count);
  for (int c = 0; c < component_count; ++c) by_head[c] = c;
  std::sort(by_head.begin(), by_head.end(), [&](int a, int b) { return components_[a].task < components_[b].task; });
  for (int level = static_cast<int>(levels_.size()) - 2; level >= 0; --level) {
    // Units of this level in pipeline order of their first component.
    const std::vector<int>& unit_of = levels_[level];
    std::vector<std::vector<int>> units;
    std::fill(unit_index.begin(), unit_index.end(), -1);
    for (int c : by_head) {
      int& index = unit_index[unit_of[c]];
      if (index < 0) {
        index = static_cast<int>(units.size());
        units.emplace_back();
      }
      units[index].push_back(c);
    }
    for (const std::vector<int>& unit : units)
      if (try_move(unit)) ++result.uncoarsening_moves;
  }
}

// ---------------------------------------------------------------- compaction

// Greedy split of `sequence` into maximal contiguous parts with compute <= bound and memory within
// the limit. Returns {number of parts, largest part compute}; parts = +inf when one group alone
// exceeds the bound. Fills `cuts` (start index of each part) when given.
std::pair<double, double> BlockPartitioner::greedy_split(const std::vector<int>& sequence, double bound,
                                                         std::vector<std::size_t>* cuts) {
  if (cuts) cuts->clear();
  double parts = 0, largest = 0;
  std::size_t i = 0;
  while (i < sequence.size()) {
    const int epoch = ++task_epoch_;  // constant clones already in this part
    double seconds = 0, bytes = 0;
    std::size_t j = i;
    while (j < sequence.size()) {
      const Group& group = groups_[sequence[j]];
      double add_seconds = group.own_seconds, add_bytes = group.own_bytes;
      for (const auto& [task, count] : group.constants.entries()) {
        if (task_mark_[task] == epoch) continue;
        add_seconds += options_.task_seconds[task];
        add_bytes += options_.task_memory_bytes[task];
      }
      if (j > i && (seconds + add_seconds > bound || bytes + add_bytes > options_.memory_limit_bytes)) break;
      if (j == i && seconds + add_seconds > bound) return {std::numeric_limits<double>::infinity(), 0};
      for (const auto& [task, count] : group.constants.entries()) task_mark_[task] = epoch;
      seconds += add_seconds;
      bytes += add_bytes;
      ++j;
    }
    if (cuts) cuts->push_back(i);
    parts += 1;
    largest = std::max(largest, seconds);
    i = j;
  }
  return {parts, largest};
}

std::vector<Block> BlockPartitioner::compact() {
  const int component_count = static_cast<int>(components_.size());
  // Members and first task of every remaining group.
  std::vector<std::vector<int>> members(groups_.size());
  for (int c = 0; c < component_count; ++c) members[group_of_component_[c]].push_back(c);
  std::vector<int> first_task(groups_.size(), task_count_);
  for (int c = 0; c < component_count; ++c)
    first_task[group_of_component_[c]] = std::min(first_task[group_of_component_[c]], components_[c].task);

  // Topological order of the groups, the one with the smallest task id first among those ready.
  std::vector<int> sequence, waiting(groups_.size(), 0);
  using Entry = std::pair<int, int>;  // (first task, group)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    if (!groups_[g].alive) continue;
    waiting[g] = static_cast<int>(groups_[g].predecessors.size());
    if (waiting[g] == 0) ready.push({first_task[g], g});
  }
  while (!ready.empty()) {
    const int g = ready.top().second;
    ready.pop();
    sequence.push_back(g);
    for (const auto& [next, count] : groups_[g].successors.entries())
      if (--waiting[next] == 0) ready.push({first_task[next], next});
  }
  std::size_t live = 0;
  for (const Group& group : groups_) live += group.alive ? 1 : 0;
  PARTRAIN_CHECK(sequence.size() == live, "internal: the quotient graph of the groups has a cycle");

  // Part boundaries (start index of each part in `sequence`).
  std::vector<std::size_t> cuts;
  const double unbounded = std::numeric_limits<double>::infinity();
  if (sequence.size() <= static_cast<std::size_t>(options_.blocks)) {
    for (std::size_t i = 0; i < sequence.size(); ++i) cuts.push_back(i);
  } else {
    // Fewest parts memory allows; more than k only when memory forbids k.
    const double fewest = greedy_split(sequence, unbounded, nullptr).first;
    const double target = std::max(fewest, static_cast<double>(options_.blocks));
    double low = 0, high = 0;
    for (int g : sequence) {
      low = std::max(low, groups_[g].seconds);
      high += groups_[g].seconds;
    }
    if (greedy_split(sequence, low, nullptr).first <= target) {
      high = low;
    } else {
      high = high * (1 + 1e-12) + 1e-300;
      if (greedy_split(sequence, high, nullptr).first > target) high = unbounded;
      // Bisection on the bound; `low` infeasible, `high` feasible.
      for (int iteration = 0; iteration < 200 && std::isfinite(high); ++iteration) {
        const double middle = low + (high - low) / 2;
        if (middle <= low || middle >= high) break;
        if (greedy_split(sequence, middle, nullptr).first <= target) high = middle;
        else low = middle;
      }
    }
    greedy_split(sequence, high, &cuts);

    // Fewer parts than k: split the heaviest part (any split keeps compute and memory within the
    // bound) where the larger half is smallest; repeat.
    auto part_end = [&](std::size_t part) { return part + 1 < cuts.size() ? cuts[part + 1] : sequence.size(); };
    // prefix[i] = compute of sequence[begin, begin + i); suffix[i] = compute of sequence[begin + i, end).
    std::vector<double> prefix, suffix;
    auto profile_part = [&](std::size_t begin, std::size_t end) {
      const std::size_t length = end - begin;
      prefix.assign(length + 1, 0.0);
      suffix.assign(length + 1, 0.0);
      auto group_seconds = [&](std::size_t i, int epoch) {
        const Group& group = groups_[sequence[i]];
        double seconds = group.own_seconds;
        for (const auto& [task, count] : group.constants.entries()) {
          if (task_mark_[task] == epoch) continue;
          task_mark_[task] = epoch;
          seconds += options_.task_seconds[task];
        }
        return seconds;
      };
      int epoch = ++task_epoch_;
      for (std::size_t i = 0; i < length; ++i) prefix[i + 1] = prefix[i] + group_seconds(begin + i, epoch);
      epoch = ++task_epoch_;
      for (std::size_t i = length; i-- > 0;) suffix[i] = suffix[i + 1] + group_seconds(begin + i, epoch);
    };
    std::vector<double> part_seconds;
    for (std::size_t part = 0; part < cuts.size(); ++part) {
      profile_part(cuts[part], part_end(part));
      part_seconds.push_back(prefix.back());
    }
    while (static_cast<double>(cuts.size()) < target) {
      std::size_t heaviest = cuts.size();
      for (std::size_t part = 0; part < cuts.size(); ++part) {
        if (part_end(part) - cuts[part] < 2) continue;
        if (heaviest == cuts.size() || part_seconds[part] > part_seconds[heaviest]) heaviest = part;
      }
      PARTRAIN_CHECK(heaviest < cuts.size(), "internal: no part left to split");
      const std::size_t begin = cuts[heaviest], end = part_end(heaviest);
      profile_part(begin, end);
      std::size_t best = 1;
      for (std::size_t split = 2; split < end - begin; ++split)
        if (std::max(prefix[split], suffix[split]) < std::max(prefix[best], suffix[best])) best = split;
      cuts.insert(cuts.begin() + static_cast<std::ptrdiff_t>(heaviest) + 1, begin + best);
      part_seconds[heaviest] = prefix[best];
      part_seconds.insert(part_seconds.begin() + static_cast<std::ptrdiff_t>(heaviest) + 1, suffix[best]);
    }
  }

  // Blocks: every task of the member components, clones once.
  std::vector<Block> blocks;
  for (std::size_t part = 0; part < cuts.size(); ++part) {
    const std::size_t end = part + 1 < cuts.size() ? cuts[part + 1] : sequence.size();
    const int epoch = ++task_epoch_;
    Block block;
    for (std::size_t i = cuts[part]; i < end; ++i) {
      for (int c : members[sequence[i]]) {
        for (int task : components_[c].tasks) {
          if (task_mark_[task] == epoch) continue;
          task_mark_[task] = epoch;
          block.tasks.push_back(task);
        }
      }
    }
    std::sort(block.tasks.begin(), block.tasks.end());
    for (int task : block.tasks) {
      block.compute_seconds += options_.task_seconds[task];
      block.memory_bytes += options_.task_memory_bytes[task];
    }
    blocks.push_back(std::move(block));
  }
  return blocks;
}

BlockPartition BlockPartitioner::run() {
  BlockPartition result;
  levels_.push_back(group_of_component_);
  if (options_.coarsen) coarsen(result);
  else result.coarsened_groups = groups_.size();
  const double bandwidth = options_.bandwidth_bytes_per_second;
  result.coarsened_communication_seconds = grouping_bytes() / bandwidth;
  if (options_.uncoarsen) uncoarsen(result);
  result.uncoarsened_communication_seconds = grouping_bytes() / bandwidth;
  result.blocks = compact();
  result.communication_seconds = communication_seconds(graph_, result.blocks, options_);
  return result;
}

}  // namespace

double activation_bytes(const Graph& graph, int value, std::int64_t batch) {
  const TensorType& type = graph.value(value).type;
  return static_cast<double>(numel(with_batch(type.shape, batch))) * static_cast<double>(dtype_size(type.dtype));
}

double communication_seconds(const Graph& graph, const std::vector<Block>& blocks, const BlockOptions& options) {
  PARTRAIN_CHECK(options.bandwidth_bytes_per_second > 0,
                 "bandwidth must be positive, got " << options.bandwidth_bytes_per_second << " B/s");
  std::vector<int> block_of(graph.tasks().size(), -1);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    for (int task : blocks[b].tasks) {
      PARTRAIN_CHECK(task >= 0 && task < static_cast<int>(graph.tasks().size()), "block " << b << " lists unknown task "
                                                                                          << task);
      if (graph.task(task).constant) continue;
      PARTRAIN_CHECK(block_of[task] < 0, "non-constant task '" << graph.task(task).name << "' is in blocks "
                                                               << block_of[task] << " and " << b);
      block_of[task] = static_cast<int>(b);
    }
  }
  double bytes = 0;
  for (const Task& task : graph.tasks()) {
    if (task.constant) continue;
    PARTRAIN_CHECK(block_of[task.id] >= 0, "non-constant task '" << task.name << "' is in no block");
    for (int output : task.outputs) {
      std::vector<int> receivers;
      for (int consumer : graph.value(output).consumers) {
        const int block = block_of[consumer];
        if (block != block_of[task.id] && std::find(receivers.begin(), receivers.end(), block) == receivers.end())
          receivers.push_back(block);
      }
      if (!receivers.empty()) bytes += activation_bytes(graph, output, options.batch) * static_cast<double>(receivers.size());
    }
  }
  return bytes / options.bandwidth_bytes_per_second;
}

BlockPartition partition_blocks_detailed(const Graph& graph, const std::vector<AtomicComponent>& components,
                                         const BlockOptions& options) {
  BlockPartitioner partitioner(graph, components, options);
  return partitioner.run();
}

std::vector<Block> partition_blocks(const Graph& graph, const std::vector<AtomicComponent>& components,
                                    const BlockOptions& options) {
  return partition_blocks_detailed(graph, components, options).blocks;
}

}  // namespace partrain::partition
