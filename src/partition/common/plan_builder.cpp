#include "partition/common/weight_gradient_share.h"
#include "partition/common/plan_builder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "graph/layer_names.h"
#include "partition/common/recomputation.h"
#include "plan/schedule.h"
#include "plan/schedule_simulator.h"

namespace partrain::partition {

std::vector<std::vector<int>> attach_constant_tasks(const Graph& graph, std::vector<std::vector<int>> stages) {
  const std::vector<Task>& tasks = graph.tasks();
  std::vector<int> stage_of(tasks.size(), -1);
  for (std::size_t s = 0; s < stages.size(); ++s)
    for (int task : stages[s]) stage_of[task] = static_cast<int>(s);
  std::vector<std::vector<int>> needed_by(tasks.size());
  for (auto task = tasks.rbegin(); task != tasks.rend(); ++task) {
    if (!task->constant) continue;
    std::vector<int>& into = needed_by[task->id];
    for (int output : task->outputs)
      for (int consumer : graph.value(output).consumers) {
        if (stage_of[consumer] >= 0 && !tasks[consumer].constant) into.push_back(stage_of[consumer]);
        into.insert(into.end(), needed_by[consumer].begin(), needed_by[consumer].end());
      }
    std::sort(into.begin(), into.end());
    into.erase(std::unique(into.begin(), into.end()), into.end());
    if (into.empty() && !stages.empty()) into.push_back(static_cast<int>(stages.size()) - 1);
    for (int s : into) stages[s].push_back(task->id);
  }
  for (std::vector<int>& stage : stages) {
    std::sort(stage.begin(), stage.end());
    stage.erase(std::unique(stage.begin(), stage.end()), stage.end());
  }
  return stages;
}

namespace {

// Tasks grouped by layer name in order of first task, constant tasks cloned into their consumers'
// groups; not yet in pipeline order.
std::vector<LayerGroup> named_layer_groups(const Graph& graph) {
  std::vector<LayerGroup> groups;
  std::vector<std::vector<int>> tasks;
  std::map<std::string, std::size_t> group_index;
  for (const Task& task : graph.tasks()) {
    if (task.constant) continue;
    auto [found, inserted] = group_index.try_emplace(layer_of(task.name), groups.size());
    if (inserted) {
      groups.push_back({found->first, {}});
      tasks.emplace_back();
    }
    tasks[found->second].push_back(task.id);
  }
  tasks = attach_constant_tasks(graph, std::move(tasks));
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].tasks = std::move(tasks[g]);
  return groups;
}

}  // namespace

std::vector<LayerGroup> layer_groups(const Graph& graph) {
  // Pipeline order: groups sorted topologically by the edges between their (non-constant) tasks,
  // ties by first task, since a layer can start before another that feeds it (BERT with NSP: the
  // pooler feeds the NSP part of "head", whose first task comes earlier). Groups on a dependency
  // cycle, if any, are merged into one named "a+b".
  const std::vector<LayerGroup> groups = named_layer_groups(graph);
  const int n = static_cast<int>(groups.size());
  std::vector<int> group_of(graph.tasks().size(), -1);
  for (int g = 0; g < n; ++g)
    for (int task : groups[g].tasks)
      if (!graph.task(task).constant) group_of[task] = g;
  std::vector<std::vector<int>> successors(n);
  for (const Task& task : graph.tasks()) {
    if (task.constant || group_of[task.id] < 0) continue;
    for (int input : task.inputs) {
      const int producer = graph.value(input).producer;
      if (producer < 0 || graph.task(producer).constant || group_of[producer] < 0) continue;
      if (group_of[producer] != group_of[task.id]) successors[group_of[producer]].push_back(group_of[task.id]);
    }
  }
  // Strongly connected components (Tarjan); groups on a cycle become one.
  std::vector<int> component(n, -1), order_index(n, -1), low(n, 0), stack;
  std::vector<bool> on_stack(n, false);
  int counter = 0, components = 0;
  std::function<void(int)> visit = [&](int v) {
    order_index[v] = low[v] = counter++;
    stack.push_back(v);
    on_stack[v] = true;
    for (int w : successors[v]) {
      if (order_index[w] < 0) {
        visit(w);
        low[v] = std::min(low[v], low[w]);
      } else if (on_stack[w]) {
        low[v] = std::min(low[v], order_index[w]);
      }
    }
    if (low[v] == order_index[v]) {
      int w;
      do {
        w = stack.back();
        stack.pop_back();
        on_stack[w] = false;
        component[w] = components;
      } while (w != v);
      ++components;
    }
  };
  for (int v = 0; v < n; ++v)
    if (order_index[v] < 0) visit(v);
  // Members of each component (ascending group index) and the condensed edges.
  std::vector<std::vector<int>> members(components);
  for (int v = 0; v < n; ++v) members[component[v]].push_back(v);
  std::vector<std::vector<int>> condensed(components);
  std::vector<int> indegree(components, 0);
  for (int v = 0; v < n; ++v)
    for (int w : successors[v])
      if (component[v] != component[w]) condensed[component[v]].push_back(component[w]);
  for (auto& edges : condensed) {
    std::sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    for (int w : edges) ++indegree[w];
  }
  // Kahn's algorithm, the component with the earliest group first among the ready ones.
  using Entry = std::pair<int, int>;  // (first member group, component)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
  for (int c = 0; c < components; ++c)
    if (indegree[c] == 0) ready.push({members[c].front(), c});
  std::vector<LayerGroup> ordered;
  while (!ready.empty()) {
    const int c = ready.top().second;
    ready.pop();
    LayerGroup merged;
    for (int g : members[c]) {
      merged.name += (merged.name.empty() ? "" : "+") + groups[g].name;
      merged.tasks.insert(merged.tasks.end(), groups[g].tasks.begin(), groups[g].tasks.end());
    }
    std::sort(merged.tasks.begin(), merged.tasks.end());
    merged.tasks.erase(std::unique(merged.tasks.begin(), merged.tasks.end()), merged.tasks.end());
    ordered.push_back(std::move(merged));
    for (int w : condensed[c])
      if (--indegree[w] == 0) ready.push({members[w].front(), w});
  }
  return ordered;
}

std::vector<int> join_groups(const std::vector<LayerGroup>& groups, std::size_t first, std::size_t last) {
  PARTRAIN_CHECK(first <= last && last <= groups.size(), "join_groups: bad range [" << first << ", " << last << ")");
  std::vector<int> tasks;
  for (std::size_t g = first; g < last; ++g) tasks.insert(tasks.end(), groups[g].tasks.begin(), groups[g].tasks.end());
  std::sort(tasks.begin(), tasks.end());
  tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
  return tasks;
}

RecomputePolicy recompute_policy(const PlannerOptions& options, int stage_count) {
  if (options.recompute == "auto") return stage_count > 1 ? RecomputePolicy::StageBoundaries : RecomputePolicy::None;
  return parse_recompute(options.recompute);
}

profile::MemoryPolicy stage_memory_policy(const PlannerOptions& options, int stage, int stage_count, int microbatches,
                                          int data_parallel) {
  profile::MemoryPolicy policy;
  policy.optimizer_shards = options.zero == 1 ? std::max(1, data_parallel) : 1;
  policy.optimizer_state_copies = options.optimizer_state_copies;
  policy.mixed_precision = options.mixed_precision;
  policy.recompute = recompute_policy(options, stage_count) != RecomputePolicy::None;
  policy.microbatches_in_flight =
      microbatches_in_flight(options.schedule, stage, stage_count, microbatches, policy.recompute);
  const int v = options.virtual_stages;
  if (options.schedule == ScheduleKind::Interleaved && v > 1 && stage_count % v == 0) {
    // `stage` is a model chunk on pipeline stage p of S: Megatron's interleaved order runs w warm-up
    // forward steps over the rank's v chunks, so each chunk holds about (w + 1) / v microbatches.
    const int S = stage_count / v, p = stage % S;
    const int warmup = microbatches == S ? microbatches * v : std::min(microbatches * v, (S - p - 1) * 2 + (v - 1) * S);
    policy.microbatches_in_flight = std::max(1, std::min(microbatches, (warmup + 1 + v - 1) / v));
  }
  // zb_v: a rank's two chunks hold at most 2S chunk-microbatches before their W (zero_bubble_v.h),
  // S whole microbatches as 1F1B's first stage: min(S, M) per chunk.
  if (options.schedule == ScheduleKind::ZeroBubbleV && stage_count >= 2)
    policy.microbatches_in_flight = std::min(stage_count / 2, microbatches);
  return policy;
}

namespace {
// Whether a group of `devices` consecutive devices spans more than one node.
bool spans_nodes(const CostModel& cost, int devices) { return devices > cost.device().devices_per_node; }

// Where a stage's layers begin: the smallest non-constant task id of each layer group the stage
// holds, ascending. Recomputing the tasks below starts[j] recomputes the stage's first j layers.
std::vector<int> layer_starts(const Graph& graph, const std::vector<LayerGroup>& groups, const PlanStage& stage) {
  std::vector<int> starts;
  for (const LayerGroup& group : groups) {
    for (int task : group.tasks) {
      if (graph.task(task).constant || !std::binary_search(stage.tasks.begin(), stage.tasks.end(), task)) continue;
      starts.push_back(task);  // the group's tasks ascend: its first one in the stage
      break;
    }
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  return starts;
}

// Merak's stage-aware recomputation (merak.txt §6.2): stage i keeps the activations of a fraction
// α_i of its layers and recomputes the others (the first ones, from the stage's inputs). The paper
// assumes every stage then uses the same memory, M_r + n_i·α_i·M_a with n_i the extra microbatches
// the stage holds, which gives α_i = min(1, n_1·α_1 / n_i) (its recursive formula: n_i = s − i under
// scp, and the second-to-last stage's extra forward gives it α_{s−2}'s share); it then raises α_1 in
// steps until the memory runs out. Here the steps are stage 1's layers, from all kept down, and
// "runs out" is the memory model's verdict on every stage (α_i rounded down to whole layers); with
// nothing fitting, everything is recomputed. Sets each stage's recompute and recompute_until_task.
void choose_stage_aware_recomputation(Plan& plan, const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const int stage_count = static_cast<int>(plan.stages.size());
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const double usable = options.usable_memory_bytes(cost.device());
  struct StageFigures {
    std::vector<int> starts;          // layer_starts
    profile::Measurement whole;       // the stage at its per-replica microbatch
    std::map<int, double> kept_bytes;  // kept layers -> their activation bytes
    std::int64_t batch = 0;
    int extra = 0;                    // n_i: microbatches in flight beyond the one in its backward
    profile::MemoryPolicy policy;
  };
  std::vector<StageFigures> figures(stage_count);
  for (int s = 0; s < stage_count; ++s) {
    StageFigures& f = figures[s];
    const PlanStage& stage = plan.stages[s];
    auto [begin, end] = plan.replica_samples(s, 0);
    f.batch = end - begin;
    f.starts = layer_starts(graph, groups, stage);
    f.whole = cost.measure(stage.tasks, f.batch);
    f.policy = stage_memory_policy(options, s, stage_count, plan.microbatches, stage.replicas * plan.pipeline_replicas);
    f.policy.recompute = true;
    f.extra = std::max(0, f.policy.microbatches_in_flight - 1);
    // The last stage under scp never recomputes (the schedule generator's rule): all kept.
    if (plan.schedule == ScheduleKind::ShiftedCriticalPath && s == stage_count - 1) f.extra = 0;
  }
  const auto kept_bytes = [&](StageFigures& f, const PlanStage& stage, int kept) {
    const int layers = static_cast<int>(f.starts.size());
    if (kept <= 0) return 0.0;
    if (kept >= layers) return f.whole.activation_bytes;
    auto found = f.kept_bytes.find(kept);
    if (found != f.kept_bytes.end()) return found->second;
    std::vector<int> tasks;
    for (int task : stage.tasks)
      if (task >= f.starts[layers - kept]) tasks.push_back(task);
    return f.kept_bytes[kept] = cost.measure(tasks, f.batch).activation_bytes;
  };
  // The layers stage s keeps for stage 1's α_1.
  const auto kept_layers = [&](int s, double alpha_first) {
    const StageFigures& f = figures[s];
    const int layers = static_cast<int>(f.starts.size());
    if (f.extra == 0) return layers;
    const double alpha = std::min(1.0, alpha_first * figures[0].extra / f.extra);
    return static_cast<int>(std::floor(alpha * layers + 1e-9));
  };
  const int first_layers = std::max<int>(1, static_cast<int>(figures[0].starts.size()));
  std::vector<int> chosen(stage_count, 0);
  for (int kept_first = first_layers; kept_first >= 0; --kept_first) {
    const double alpha_first = static_cast<double>(kept_first) / first_layers;
    bool fits = true;
    std::vector<int> kept(stage_count);
    for (int s = 0; s < stage_count && fits; ++s) {
      StageFigures& f = figures[s];
      kept[s] = kept_layers(s, figures[0].extra == 0 ? 1.0 : alpha_first);
      profile::MemoryPolicy policy = f.policy;
      if (kept[s] >= static_cast<int>(f.starts.size())) {
        policy.recompute = false;
        if (!schedule_has_chunks(options.schedule))
          policy.microbatches_in_flight = microbatches_in_flight(options.schedule, s, stage_count, plan.microbatches, false);
      } else {
        policy.kept_activation_bytes = kept_bytes(f, plan.stages[s], kept[s]);
      }
      fits = profile::stage_memory_bytes(f.whole, policy) <= usable;
    }
    chosen = kept;
    if (fits) break;
  }
  for (int s = 0; s < stage_count; ++s) {
    PlanStage& stage = plan.stages[s];
    const int layers = static_cast<int>(figures[s].starts.size());
    stage.recompute_until_task = -1;
    if (chosen[s] >= layers) {
      stage.recompute = RecomputePolicy::None;
    } else if (chosen[s] <= 0) {
      stage.recompute = RecomputePolicy::StageBoundaries;
    } else {
      stage.recompute = RecomputePolicy::StageAware;
      stage.recompute_until_task = figures[s].starts[layers - chosen[s]];
    }
  }
}

// Per Plan::stages entry: the share of its parameter bytes that other pipeline stages read too (the
// tied embedding and LM head); the runtime reduces those in the optimizer step over the ranks of
// every stage reading them, not in the stage's data-parallel all-reduce.
std::vector<double> tied_parameter_shares(const Plan& plan, const Graph& graph) {
  std::map<int, std::vector<int>> stages_reading;  // parameter -> pipeline stages
  std::vector<std::vector<int>> parameters(plan.stages.size());
  for (std::size_t chunk = 0; chunk < plan.stages.size(); ++chunk) {
    for (int task : plan.stages[chunk].tasks)
      for (int input : graph.task(task).inputs)
        if (graph.value(input).kind == ValueKind::Param) parameters[chunk].push_back(input);
    std::sort(parameters[chunk].begin(), parameters[chunk].end());
    parameters[chunk].erase(std::unique(parameters[chunk].begin(), parameters[chunk].end()), parameters[chunk].end());
    const int stage = plan.stage_of_chunk(static_cast<int>(chunk));
    for (int parameter : parameters[chunk]) {
      std::vector<int>& stages = stages_reading[parameter];
      if (std::find(stages.begin(), stages.end(), stage) == stages.end()) stages.push_back(stage);
    }
  }
  std::vector<double> shares(plan.stages.size(), 0.0);
  for (std::size_t chunk = 0; chunk < plan.stages.size(); ++chunk) {
    double tied = 0, all = 0;
    for (int parameter : parameters[chunk]) {
      const double bytes = static_cast<double>(graph.value(parameter).type.bytes(1));
      all += bytes;
      if (stages_reading[parameter].size() > 1) tied += bytes;
    }
    shares[chunk] = all > 0 ? tied / all : 0.0;
  }
  return shares;
}
// Interleaved plans: each pipeline stage's peak from its rank's action list, which says which chunks'
// microbatches are in flight together (the per-chunk microbatches_in_flight of stage_memory_policy
// averages them and overcounts the last chunk, whose microbatches go straight to their backward).
// `memory` holds each chunk's parts (Plan::stages order).
void record_rank_peaks(Plan& plan, const Schedule& schedule, const std::vector<profile::StageMemory>& memory) {
  plan.rank_peak_bytes.clear();
  if (plan.schedule != ScheduleKind::Interleaved || plan.virtual_stages < 2) return;
  for (int s = 0; s < plan.pipeline_stages(); ++s) {
    std::vector<profile::StageMemory> chunks;
    for (int chunk : plan.chunks_of_stage(s)) chunks.push_back(memory[chunk]);
    const std::vector<Action>& actions = schedule.at(plan.rank_of(Placement{0, s, 0, 0}));
    plan.rank_peak_bytes.push_back(rank_peak_bytes(chunks, in_flight_states(actions, static_cast<int>(chunks.size()))));
  }
}
}  // namespace

double rank_peak_bytes(std::span<const profile::StageMemory> chunks, std::span<const InFlightState> states) {
  double model_state = 0;
  std::vector<double> microbatch_bytes, working_bytes;
  for (const profile::StageMemory& chunk : chunks) {
    model_state += chunk.model_state;
    microbatch_bytes.push_back(chunk.per_microbatch);
    working_bytes.push_back(chunk.working);
  }
  return model_state + peak_activation_bytes(states, microbatch_bytes, working_bytes);
}

namespace {
// The cache each model chunk's ranks have to themselves where the cost model prices a shared cache
// (CostModel::cache_share; empty where it does not): the node's cache less the data the rest of the
// node keeps touching (cache_footprint_bytes of the other ranks' chunks and of the rank's own other
// chunks), the least over the chunk's ranks. Ranks fill nodes in rank order (Plan::rank_of),
// cache_share().ranks to a node, as the profile's node held them. A small stage beside a large one
// thus has the cache the large one leaves, not an even share.
std::vector<double> chunk_cache_bytes(const Plan& plan, const CostModel& cost) {
  const CacheShare share = cost.cache_share();
  if (!(share.bytes > 0)) return {};
  const int chunk_count = static_cast<int>(plan.stages.size());
  std::vector<double> chunk_footprint(chunk_count);
  for (int c = 0; c < chunk_count; ++c) {
    auto [begin, end] = plan.replica_samples(c, 0);
    chunk_footprint[c] = cache_footprint_bytes(cost.measure(plan.stages[c].tasks, end - begin));
  }
  const int world = plan.pipeline_replicas * plan.devices_per_pipeline_replica();
  std::vector<int> stage_of_rank(world);
  std::vector<double> rank_footprint(world, 0.0);
  for (int rank = 0; rank < world; ++rank) {
    stage_of_rank[rank] = plan.placement_of(rank).stage;
    for (int chunk : plan.chunks_of_stage(stage_of_rank[rank])) rank_footprint[rank] += chunk_footprint[chunk];
  }
  std::vector<double> cache(chunk_count, std::numeric_limits<double>::infinity());
  for (int first = 0; first < world; first += share.ranks) {
    const int last = std::min(world, first + share.ranks);
    double node = 0;
    for (int rank = first; rank < last; ++rank) node += rank_footprint[rank];
    for (int rank = first; rank < last; ++rank)
      for (int chunk : plan.chunks_of_stage(stage_of_rank[rank]))
        cache[chunk] = std::min(cache[chunk], std::max(0.0, share.bytes - (node - chunk_footprint[chunk])));
  }
  return cache;
}
}  // namespace

void predict_plan(Plan& plan, const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const int stage_count = static_cast<int>(plan.stages.size());
  // devices_per_pipeline_replica() counts ranks (× tensor_parallel); a planner working on groups of t ranks
  // calls this with tensor_parallel still 1 and a cost model whose node holds devices_per_node / t
  // groups (make_plan), so both count the same.
  const bool across_nodes = spans_nodes(cost, plan.devices_per_pipeline_replica());
  plan.world_size = plan.pipeline_replicas * plan.devices_per_pipeline_replica();
  const bool stage_aware = recompute_policy(options, stage_count) == RecomputePolicy::StageAware;
  if (stage_aware) choose_stage_aware_recomputation(plan, graph, cost, options);
  const double usable = options.usable_memory_bytes(cost.device());
  const std::vector<double> tied_shares = tied_parameter_shares(plan, graph);
  int tied_group = 0;  // the ranks (groups of t) of every pipeline stage sharing parameters
  for (int s = 0; s < plan.pipeline_stages(); ++s) {
    bool tied = false;
    for (int chunk : plan.chunks_of_stage(s)) tied = tied || tied_shares[chunk] > 0;
    if (tied) tied_group += plan.stages[plan.chunks_of_stage(s).front()].replicas * plan.pipeline_replicas;
  }
  std::vector<profile::StageMemory> chunk_memory(stage_count);
  const std::vector<double> cache_bytes = chunk_cache_bytes(plan, cost);
  for (int s = 0; s < stage_count; ++s) {
    PlanStage& stage = plan.stages[s];
    auto [begin, end] = plan.replica_samples(s, 0);  // replica 0 holds the largest share
    const profile::Measurement m = cache_bytes.empty() ? cost.measure(stage.tasks, end - begin)
                                                       : cost.measure_in_cache(stage.tasks, end - begin, cache_bytes[s]);
    const int group = stage.replicas * plan.pipeline_replicas;  // the stage's data-parallel group
    profile::MemoryPolicy policy = stage_memory_policy(options, s, stage_count, plan.microbatches, group);
    StageRecomputation recomputation;  // the forward the backward repeats, and the memory it saves
    if (options.recompute == "auto") {
      recomputation = choose_stage_recomputation(stage, graph, cost, options, s, stage_count, plan.microbatches, group,
                                                 end - begin, m, usable / plan.virtual_stages);
      policy = recomputation_memory_policy(options, s, stage_count, plan.microbatches, group, recomputation);
    } else {
      if (!stage_aware) {
        stage.recompute = recompute_policy(options, stage_count);
        stage.recompute_until_task = -1;
        stage.recompute_layers = options.recompute_layers;
      }
      recomputation = stage_recomputation(graph, cost, stage, end - begin, options.mixed_precision, m);
      if (stage_aware || recomputation.segmented)
        policy = recomputation_memory_policy(options, s, stage_count, plan.microbatches, group, recomputation);
    }
    const double recompute_seconds = recomputation.recompute_seconds;
    stage.recompute_seconds = recompute_seconds;
    stage.forward_seconds = m.forward_seconds + cost.transfer_seconds(m.boundary_output_bytes, across_nodes);
    stage.backward_seconds = m.backward_seconds + cost.transfer_seconds(m.boundary_input_bytes, across_nodes) +
                             recompute_seconds;
    // Recomputed segments keep their weight gradients in the input half (runtime/stage_program.h).
    const bool segmented = stage.recompute == RecomputePolicy::Layers || stage.recompute == RecomputePolicy::Selective;
    stage.weight_gradient_seconds =
        m.backward_seconds * weight_gradient_share(graph, stage.tasks, segmented ? recomputed_tasks(graph, stage) : std::vector<int>{});
    // ZeRO-1 shards the untied parameters only: the tied ones are reduced over their stages whole.
    const double tied_bytes = m.parameter_bytes * tied_shares[s];
    policy.unsharded_parameter_bytes = tied_bytes;
    chunk_memory[s] = profile::stage_memory(m, policy);
    stage.memory_bytes = chunk_memory[s].total();
    stage.working_bytes = chunk_memory[s].working;
    if (stage.summary.empty()) stage.summary = summarize_tasks(graph, stage.tasks);
    // Under ZeRO-1 each rank then updates only its 1 / shards of the parameters, and the all-gather
    // that follows the step hides under nothing.
    const GradientSynchronisation synchronisation =
        gradient_synchronisation_seconds(cost, m.parameter_bytes - tied_bytes, group,
                                         spans_nodes(cost, group * plan.tensor_parallel), options.zero == 1,
                                         options.mixed_precision);
    stage.allreduce_seconds = synchronisation.total();
    stage.allreduce_hidden_seconds = allreduce_hidden_seconds(synchronisation.reduce, stage.backward_seconds,
                                                              m.parameter_bytes - tied_bytes, options.overlap_bucket_bytes);
    stage.tied_allreduce_seconds =
        tied_bytes > 0 ? cost.allreduce_seconds(tied_bytes, tied_group,
                                                across_nodes || spans_nodes(cost, tied_group * plan.tensor_parallel))
                       : 0.0;
    stage.optimizer_seconds = cost.optimizer_step_seconds(
        (m.parameter_bytes - tied_bytes) / policy.optimizer_shards + tied_bytes, options.optimizer);
  }
  // The step time is the schedule's own action lists simulated with these costs: gpipe, 1f1b and
  // scp get their own bubbles, and each stage's all-reduce starts when that stage's backwards end.
  const CoreShare cores = cost.core_share();
  plan.ranks_per_node = cores.ranks_per_node;
  plan.concurrent_ranks_per_node = cores.concurrent_ranks;
  const Schedule schedule = generate_schedule(plan);
  const TimelinePrediction prediction = simulate_schedule(plan, schedule, TimelineCosts::from_plan(plan));
  record_rank_peaks(plan, schedule, chunk_memory);
  plan.predicted_step_seconds = prediction.step_seconds;
  plan.predicted_bubble_fraction = prediction.bubble_fraction;
  plan.device_memory_bytes = cost.device().memory_bytes;
  plan.cost_model = cost.description();
}

double memory_excess_bytes(const Plan& plan, const CostModel& cost, const PlannerOptions& options) {
  double largest = 0.0;
  // A rank holds every model chunk of its pipeline stage (one chunk per stage without interleaving).
  for (int s = 0; s < plan.pipeline_stages(); ++s) {
    largest = std::max(largest, plan.rank_memory_bytes(s));
  }
  return largest - options.usable_memory_bytes(cost.device());
}

bool move_loss_pieces_off_unequal_boundaries(const Graph& graph, Plan& plan) {
  bool moved = false;
  for (;;) {
    const UnbatchedCrossing* offending = nullptr;
    const std::vector<UnbatchedCrossing> crossings = unbatched_crossings(graph, plan.stages);
    for (const UnbatchedCrossing& crossing : crossings)
      for (int s = crossing.from_stage + 1; s <= crossing.to_stage && !offending; ++s)
        if (plan.stages[s].replicas != plan.stages[crossing.from_stage].replicas) offending = &crossing;
    if (!offending) break;
    const int producer = graph.value(offending->value).producer;
    int target = offending->to_stage;  // the first later stage that reads the value
    for (int consumer : graph.value(offending->value).consumers)
      for (int s = offending->from_stage + 1; s < target; ++s)
        if (std::binary_search(plan.stages[s].tasks.begin(), plan.stages[s].tasks.end(), consumer)) target = s;
    std::vector<std::vector<int>> stages;  // non-constant tasks, the producer moved
    for (int s = 0; s < static_cast<int>(plan.stages.size()); ++s) {
      std::vector<int> tasks;
      for (int task : plan.stages[s].tasks)
        if (!graph.task(task).constant && task != producer) tasks.push_back(task);
      if (s == target) tasks.push_back(producer);
      PARTRAIN_CHECK(!tasks.empty(), "plan (" << plan.planner << "): stage " << s << " holds only "
                                              << graph.task(producer).name << ", whose output "
                                              << graph.value(offending->value).name
                                              << " cannot cross to a stage with another replica count");
      stages.push_back(std::move(tasks));
    }
    stages = attach_constant_tasks(graph, std::move(stages));
    for (int s : {offending->from_stage, target}) plan.stages[s].summary = summarize_tasks(graph, stages[s]);
    for (std::size_t s = 0; s < stages.size(); ++s) plan.stages[s].tasks = std::move(stages[s]);
    moved = true;
  }
  return moved;
}

std::vector<int> equal_replicas(int world_size, int stage_count) {
  PARTRAIN_CHECK(stage_count > 0 && stage_count <= world_size,
                 stage_count << " stages cannot be placed on " << world_size << " devices");
  PARTRAIN_CHECK(world_size % stage_count == 0,
                 stage_count << " stages do not divide the " << world_size << " devices evenly");
  return std::vector<int>(stage_count, world_size / stage_count);
}

void record_planned_settings(Plan& plan, const PlannerOptions& options) {
  plan.precision = !options.mixed_precision ? Precision::Fp32 : options.fp16 ? Precision::Fp16 : Precision::Bf16;
  plan.optimizer = options.optimizer;
  plan.optimizer_state_copies = options.optimizer_state_copies;
}

Plan plan_header(const Graph& graph, const PlannerOptions& options, const std::string& planner) {
  Plan plan;
  plan.planner = planner;
  plan.graph_hash = graph.hash();
  plan.global_batch = options.global_batch;
  plan.schedule = options.schedule;
  record_planned_settings(plan, options);
  return plan;
}

void append_stages(Plan& plan, const Graph& graph, std::vector<std::vector<int>> stage_tasks, const std::vector<int>& replicas) {
  PARTRAIN_CHECK(stage_tasks.size() == replicas.size(),
                 "append_stages: " << stage_tasks.size() << " stages but " << replicas.size() << " replica counts");
  for (std::size_t s = 0; s < stage_tasks.size(); ++s) {
    PlanStage stage;
    stage.tasks = std::move(stage_tasks[s]);
    std::sort(stage.tasks.begin(), stage.tasks.end());
    stage.replicas = replicas[s];
    stage.summary = summarize_tasks(graph, stage.tasks);
    plan.stages.push_back(std::move(stage));
  }
}

Plan plan_from_stages(const Graph& graph, std::vector<std::vector<int>> stage_tasks, std::vector<int> replicas,
                      const CostModel& cost, const PlannerOptions& options, const std::string& planner) {
  PARTRAIN_CHECK(!stage_tasks.empty() && stage_tasks.size() == replicas.size(),
                 planner << ": " << stage_tasks.size() << " stages but " << replicas.size() << " replica counts");
  Plan base = plan_header(graph, options, planner);
  base.virtual_stages = schedule_has_chunks(options.schedule) ? options.virtual_stages : 1;
  const int depth = static_cast<int>(stage_tasks.size()) / base.virtual_stages;  // pipeline stages S
  PARTRAIN_CHECK(static_cast<int>(stage_tasks.size()) % base.virtual_stages == 0 && (depth >= 2 || base.virtual_stages == 1),
                 planner << ": " << stage_tasks.size() << " model chunks cannot run as [parallel] virtual_stages = "
                         << base.virtual_stages << " chunks on each of at least 2 pipeline stages");
  const bool interleaved = options.schedule == ScheduleKind::Interleaved;  // zb_v takes any M
  PARTRAIN_CHECK(!interleaved || base.virtual_stages == 1 || options.microbatches <= 0 || options.microbatches % depth == 0,
                 planner << ": [train] microbatches = " << options.microbatches
                         << " is not a multiple of the pipeline depth " << depth
                         << ", which the interleaved schedule needs (as in Megatron-LM)");
  append_stages(base, graph, std::move(stage_tasks), replicas);
  const int devices = base.devices_per_pipeline_replica();
  PARTRAIN_CHECK(devices > 0 && options.world_size % devices == 0,
                 planner << ": " << devices << " devices per pipeline replica do not divide the world size "
                         << options.world_size);
  base.pipeline_replicas = options.world_size / devices;
  base.world_size = options.world_size;
  int widest = 0;
  for (int r : replicas) widest = std::max(widest, r);

  // Every replica of a stage takes at least one sample of each microbatch: a global batch smaller
  // than pipeline replicas x the widest stage's replicas fails for every microbatch count, so say that.
  PARTRAIN_CHECK(options.global_batch >= static_cast<std::int64_t>(base.pipeline_replicas) * widest,
                 planner << ": the global batch " << options.global_batch << " is smaller than the "
                         << base.pipeline_replicas * widest << " replicas it must feed (" << base.pipeline_replicas
                         << " pipeline replicas x " << widest
                         << " replicas of the widest stage, at least one sample each): raise train.global_batch to "
                         << base.pipeline_replicas * widest << " or use fewer replicas");
  std::vector<int> candidates;
  if (options.microbatches > 0) {
    candidates.push_back(options.microbatches);
  } else {
    for (int m = 1; m <= options.max_microbatches; m *= 2) candidates.push_back(m);
  }
  Plan best;
  bool found = false;
  double least_memory = std::numeric_limits<double>::infinity();
  std::string last_problem;
  for (int microbatches : candidates) {
    const std::int64_t per_copy_microbatches = static_cast<std::int64_t>(base.pipeline_replicas) * microbatches;
    if (options.global_batch % per_copy_microbatches != 0 || options.global_batch / per_copy_microbatches < widest) {
      last_problem = "the global batch " + std::to_string(options.global_batch) + " does not split into " +
                     std::to_string(base.pipeline_replicas) + " pipeline replicas x " + std::to_string(microbatches) +
                     " microbatches of at least " + std::to_string(widest) + " samples";
      continue;
    }
    if (interleaved && base.virtual_stages > 1 && microbatches % depth != 0) {
      last_problem = std::to_string(microbatches) + " microbatches are not a multiple of the pipeline depth " +
                     std::to_string(depth) + " (interleaved schedule)";
      continue;
    }
    Plan candidate = base;
    candidate.microbatches = microbatches;
    predict_plan(candidate, graph, cost, options);
    const double excess = memory_excess_bytes(candidate, cost, options);
    least_memory = std::min(least_memory, excess + options.usable_memory_bytes(cost.device()));
    if (excess > 0) continue;
    if (!found || candidate.predicted_step_seconds < best.predicted_step_seconds) {
      best = std::move(candidate);
      found = true;
    }
  }
  if (!found) {
    PARTRAIN_CHECK(std::isfinite(least_memory), planner << ": no plan: " << last_problem);
    const double needed = least_memory / (1.0 - options.memory_margin);
    PARTRAIN_FAIL(planner << ": the plan does not fit in " << cost.device().memory_bytes / (1ull << 30)
                          << " GiB per device; it needs at least " << std::ceil(needed / (1ull << 20)) / 1024.0
                          << " GiB per device (with memory_margin " << options.memory_margin
                          << "), or more devices");
  }
  best.validate(graph);
  return best;
}

}  // namespace partrain::partition
